# shellcheck shell=bash disable=SC2034,SC2154,SC2004,SC2153
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "gpu-holders": the processes that use GPU memory, minus protected ones; optionally
# only those whose identity (match: cmdline, command line) matches opt_filter.
# nvidia-smi's compute apps first (from the verification's read: verify.sh); the holders
# of /dev/nvidiaN only for a GPU whose memory no compute app explains (or every GPU when
# nvidia-smi cannot say), and among those only CUDA processes (with /dev/nvidia-uvm
# open): an NVML user (a monitoring agent, nvidia-smi itself) keeps the device files open
# too, uses no GPU memory, and is never a target.
# Options: opt_filter, opt_match (identity|cmdline), opt_signal, opt_grace_ms,
# opt_kill_wait_ms, opt_tree (0/1).

# Sets FC_HOLDERS (pid list, may repeat), FC_NVSMI_NOTE (why device files were read for
# every GPU, or empty), and for a scope (scope.sh) the GPUs each holder is on:
# FC_HOLDER_UUID[pid] (as nvidia-smi says) and FC_HOLDER_DEV[pid] (device files).
fc_gpu_holders() {
    local uuid i idx pid all=0
    local -A explained=() need=() listed=()
    declare -gA FC_HOLDER_DEV=() FC_HOLDER_UUID=()
    FC_HOLDERS=()
    FC_NVSMI_NOTE=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        # The verification's own read, which it takes as its first where nothing changed
        # a GPU after it (verify.sh: fc_verify_keep): one nvidia-smi fewer a teardown.
        fc_verify_keep
        local -A dev_of=()  # a GPU's UUID -> its device file's number (its minor, or index)
        # shellcheck disable=SC2153  # FC_VUUID, FC_VMINOR: the verification's (verify.sh)
        for i in "${!FC_VROWS[@]}"; do
            # The CSV reads give no minor: the driver's files do (else the index stands in).
            [[ -n ${FC_VMINOR[i]:-} ]] || fc_verify_minor_of "$i"
            [[ -n ${FC_VUUID[i]:-} ]] && dev_of[${FC_VUUID[i]}]=${FC_VMINOR[i]:-${FC_VIDX[i]}}
        done
        local -a files=(/dev/nvidia[0-9]*)
        # Without the names where a name could forge lines (verify.sh: fc_apps_trusted).
        fc_apps_trusted
        fc_apps_pairs "${FC_TAPPS[@]}"
        for i in "${!FC_APP_PID[@]}"; do
            pid=${FC_APP_PID[i]} uuid=${FC_APP_UUID[i]}
            listed[$pid]+=" $uuid"
            # And a PID the list names is a target only where it has that GPU's device
            # file open (any GPU's where the read cannot say which) and a CUDA context
            # (/dev/nvidia-uvm: a monitoring agent has every GPU's file open and none), or
            # where that cannot be told: its descriptors unreadable (another user's, by a
            # run that is not root, which cannot signal it either), no device file on the
            # node. A GPU whose memory is then left unexplained is looked for by its
            # device files, as always.
            if [[ -e ${files[0]} && -r /proc/${FC_LIVE_DIR[$pid]:-$pid}/fd ]]; then
                fc_uses_gpu "$pid" "${dev_of[$uuid]:-}" || continue
            fi
            FC_HOLDERS+=("$pid")
            FC_HOLDER_UUID[$pid]+=" $uuid"
            explained[$uuid]=1
        done
        if ((FC_VRC == 0)); then
            for i in "${!FC_VROWS[@]}"; do
                [[ ${FC_VUSED[i]} =~ ^[0-9]+$ ]] || continue
                # By its /dev/nvidiaN (fc_gpu_files): its device minor where the read
                # gave it, which need not be its index.
                ((FC_VUSED[i] > 0)) && [[ -z ${explained[${FC_VUUID[i]}]:-} ]] &&
                    need[${FC_VMINOR[i]:-${FC_VIDX[i]}}]=1
            done
        else
            FC_NVSMI_NOTE="nvidia-smi exit $FC_VRC: ${FC_VOUT%%$'\n'*};"
            FC_NVSMI_NOTE+=" CUDA processes on device files; "
            all=1
        fi
    else
        FC_NVSMI_NOTE="nvidia-smi not found; CUDA processes on device files; "
        all=1
    fi
    ((all || ${#need[@]})) || return 0
    fc_gpu_files
    for idx in "${!FC_GF[@]}"; do
        ((all)) || [[ -n ${need[$idx]:-} ]] || continue
        for pid in ${FC_GF[$idx]}; do
            [[ -n ${FC_GF_CUDA[$pid]:-} ]] || continue
            # A process nvidia-smi lists on another GPU only, or whose kin it lists so, has
            # no context on this one, though CUDA opened its file (verify.sh,
            # fc_uses_other_gpus); only a GPU nobody explains is looked for here.
            ((all)) || ! fc_uses_other_gpus "$pid" listed " ${FC_GF[$idx]} " || continue
            FC_HOLDERS+=("$pid")
            FC_HOLDER_DEV[$pid]+=" /dev/nvidia$idx"
        done
    done
}

# True when holder PID holds a GPU of the scope: by a device file, or as nvidia-smi says.
fc_holder_in_scope() {
    local gpu
    local -a held=()
    read -r -a held <<<"${FC_HOLDER_DEV[$1]:-} ${FC_HOLDER_UUID[$1]:-}"
    for gpu in "${held[@]}"; do
        fc_gpu_in_scope "$gpu" && return 0
    done
    return 1
}

fc_stage_gpu_holders() {
    local p
    local -a hits=()
    FC_WANT_IDENT=1 fc_scan
    fc_gpu_holders
    FC_WHY=()
    FC_RELWHY=()
    for p in "${FC_HOLDERS[@]}"; do
        [[ -n ${FC_CMD[$p]:-} ]] || continue
        # --gpus, an epilog's job: only holders of the scope's GPUs (scope.sh).
        if ((FC_SCOPE_GPUS_ON)) && ! fc_holder_in_scope "$p"; then
            continue
        fi
        if [[ -n $opt_filter ]]; then
            fc_subject "$p" "$opt_match"
            [[ $REPLY =~ $opt_filter ]] || continue
        fi
        hits+=("$p")
        FC_WHY[$p]=gpu
    done
    fc_signal_hits "${hits[@]}"
    FC_MESSAGE="$FC_NVSMI_NOTE$FC_MESSAGE"
}
