# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "gpu-holders": processes holding a GPU, from nvidia-smi's compute apps and from
# holders of /dev/nvidiaN (not nvidiactl, nvidia-uvm or the nvidia-caps directory),
# minus protected ones; optionally only those whose command line matches opt_filter.
# Options: opt_filter, opt_signal, opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).

# Sets FC_HOLDERS (pid list, may repeat) and FC_HOLDER_DEV[pid] (device files held).
fc_gpu_holders() {
    local out rc pid dev line target
    declare -gA FC_HOLDER_DEV=()
    FC_HOLDERS=()
    FC_NVSMI_NOTE=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        out=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits 2>&1)
        rc=$?
        if ((rc == 0)); then
            while IFS= read -r line; do
                line=${line//[[:space:]]/}
                [[ $line =~ ^[0-9]+$ ]] && FC_HOLDERS+=("$line")
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
    fc_owner_records "${FC_TARGETS[@]}"
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
    FC_MESSAGE="$FC_NVSMI_NOTE$FC_MESSAGE"
}
