# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "gpu-holders": processes holding a GPU, from nvidia-smi's compute apps and from
# holders of /dev/nvidiaN (not nvidiactl, nvidia-uvm or the nvidia-caps directory),
# minus protected ones; optionally only those whose command line matches opt_filter.
# Options: opt_filter, opt_signal, opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).

# Sets FC_HOLDERS (pid list, may repeat), FC_HOLDER_DEV[pid] (device files held) and
# FC_HOLDER_UUID[pid] (GPUs nvidia-smi says it computes on).
fc_gpu_holders() {
    local out rc pid dev line target
    declare -gA FC_HOLDER_DEV=() FC_HOLDER_UUID=()
    FC_HOLDERS=()
    FC_NVSMI_NOTE=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        out=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader,nounits 2>&1)
        rc=$?
        if ((rc == 0)); then
            while IFS= read -r line; do
                line=${line//[[:space:]]/}
                pid=${line%%,*}
                [[ $pid =~ ^[0-9]+$ ]] || continue
                FC_HOLDERS+=("$pid")
                FC_HOLDER_UUID[$pid]+=" ${line#*,}"
            done <<<"$out"
        else
            FC_NVSMI_NOTE="nvidia-smi exit $rc: ${out%%$'\n'*}; "
        fi
    else
        FC_NVSMI_NOTE="nvidia-smi not found; device files only; "
    fi
    # ls -l output, not fuser: it names the device held, and mmaps outlive no fd here
    # that fuser would see but nvidia-smi would miss.
    while read -r pid _ target; do
        [[ $target =~ ^/dev/nvidia[0-9]+$ ]] || continue
        FC_HOLDERS+=("$pid")
        dev=${FC_HOLDER_DEV[$pid]:-}
        [[ " $dev " == *" $target "* ]] || FC_HOLDER_DEV[$pid]="${dev:+$dev }$target"
    done < <(fc_open_fds /dev/nvidia)
}

fc_stage_gpu_holders() {
    local p
    local -a hits=()
    fc_scan
    fc_gpu_holders
    for p in "${FC_HOLDERS[@]}"; do
        [[ -n ${FC_CMD[$p]:-} ]] || continue
        # --gpus, an epilog's job: only holders of the scope's GPUs (scope.sh).
        if ((FC_SCOPE_GPUS_ON)) && ! fc_holder_in_scope "$p"; then
            continue
        fi
        if [[ -n $opt_filter ]]; then
            [[ ${FC_CMD[$p]} =~ $opt_filter ]] || continue
        fi
        hits+=("$p")
    done
    if ((opt_tree)); then
        fc_expand "${hits[@]}"
    else
        fc_keep_unprotected "${hits[@]}"
    fi
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
    FC_MESSAGE="$FC_NVSMI_NOTE$FC_MESSAGE"
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
