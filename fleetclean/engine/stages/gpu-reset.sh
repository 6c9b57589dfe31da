# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "gpu-reset": reset the GPUs whose memory is a driver-level leak, and only those:
# above opt_max_used_mib, not fallen for opt_quiet_ms, and held by no process but
# protected daemons (nvidia-persistenced keeps every GPU open; a compute app or any
# unprotected holder means hands off). Waits up to opt_wait_ms for killed processes'
# memory to settle. Where the driver refuses the reset because of nvidia-persistenced,
# persistence mode is switched off for that GPU and on again afterwards, on every path
# (a trap covers an interrupted run). One "reset" record per GPU: index, result
# (ok | failed | refused | would), what happened.
# Options: opt_enabled (0/1), opt_gpus ("all" or "0 5"), opt_max_used_mib, opt_quiet_ms,
# opt_wait_ms.

fc_stage_gpu_reset() {
    local idx
    if ((!opt_enabled)); then
        FC_MESSAGE="not enabled (reset_leaked: false)"
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        FC_STATUS=failed
        FC_MESSAGE="nvidia-smi: command not found"
        return 0
    fi
    fc_gr_leaks || return 0
    FC_MATCHED=${#FC_GR_LEAKS[@]}
    if ((FC_MATCHED == 0)); then
        FC_MESSAGE="no leaked GPU memory${FC_GR_HELD:+ (held, left alone:$FC_GR_HELD)}"
        return 0
    fi
    local done=0 failed=0
    for idx in "${FC_GR_LEAKS[@]}"; do
        if ((FC_CHECK)); then
            fc_rec reset "$FC_IDX" "$idx" would "${FC_GR_MIB[$idx]} MiB held by no process"
            FC_STATUS=changed
            continue
        fi
        if fc_gr_reset "$idx"; then done=$((done + 1)); else failed=$((failed + 1)); fi
    done
    if ((FC_CHECK)); then
        FC_MESSAGE="would reset $FC_MATCHED GPU(s) with leaked memory"
    else
        FC_MESSAGE="$done of $FC_MATCHED GPU(s) with leaked memory reset"
        ((failed)) && FC_STATUS=failed
    fi
    [[ -n $FC_GR_HELD ]] && FC_MESSAGE+="; held, left alone:$FC_GR_HELD"
    return 0
}

# One read: FC_GR_USED[index] and FC_GR_PM[index] (persistence mode) for the selected
# GPUs, FC_GR_APPS[index] (" pid pid": compute apps). Fails with FC_MESSAGE set when
# nvidia-smi does.
fc_gr_read() {
    local out line idx uuid used pm rc
    local -A index_of=()
    FC_GR_APPFD=""
    [[ -n $FC_SMI_HUNG ]] || fc_smi_start FC_GR_APPFD --no-err \
        --query-compute-apps=pid,gpu_uuid --format=csv,noheader,nounits
    fc_smi --query-gpu=index,uuid,memory.used,persistence_mode --format=csv,noheader,nounits
    rc=$?
    out=$REPLY
    declare -gA FC_GR_USED=() FC_GR_PM=() FC_GR_APPS=()
    if ((rc != 0)); then
        [[ -z $FC_GR_APPFD ]] || exec {FC_GR_APPFD}<&-
        FC_STATUS=failed
        FC_MESSAGE="nvidia-smi exit $rc: ${out%%$'\n'*}"
        ((rc != 124)) || FC_MESSAGE=$out
        return 1
    fi
    declare -gA FC_GR_INDEX_OF_MINOR=()
    while IFS=', ' read -r idx uuid used pm; do
        [[ $idx =~ ^[0-9]+$ && -n $uuid ]] || continue  # an empty key ends the script
        # Its device minor, by the driver's files (verify.sh), as fc_gr_holders reads them.
        fc_minor_of_uuid "$uuid" && FC_GR_INDEX_OF_MINOR[$REPLY]=$idx
        [[ $opt_gpus == all || " $opt_gpus " == *" $idx "* ]] || continue
        index_of[$uuid]=$idx
        FC_GR_USED[$idx]=$used
        FC_GR_PM[$idx]=$pm
    done <<<"$out"
    # Its lines whatever its exit status, unless it did not answer.
    fc_smi_take "$FC_GR_APPFD"
    if (($? == 124)); then
        FC_STATUS=failed
        FC_MESSAGE=$REPLY
        return 1
    fi
    while IFS=', ' read -r line uuid; do
        idx=${index_of[$uuid]:-}
        [[ -n $idx && $line =~ ^[0-9]+$ ]] && FC_GR_APPS[$idx]+=" $line"
    done <<<"$REPLY"
    return 0
}

# Unprotected /dev/nvidiaN holders by index (FC_GR_HOLD[index]: " pid pid") and whether
# nvidia-persistenced is among the protected ones (FC_GR_PERSISTENCED[index]=pid). N is the
# GPU's device minor, which need not be its index (FC_GR_INDEX_OF_MINOR, where the
# driver's files say; N itself where they do not).
fc_gr_holders() {
    local pid target idx
    declare -gA FC_GR_HOLD=() FC_GR_PERSISTENCED=()
    while read -r pid _ target; do
        idx=${target#/dev/nvidia}
        [[ $idx =~ ^[0-9]+$ ]] || continue
        idx=${FC_GR_INDEX_OF_MINOR[$idx]:-$idx}
        fc_proc_load "$pid" || continue
        if ! fc_protected "$pid"; then
            [[ " ${FC_GR_HOLD[$idx]:-} " == *" $pid "* ]] || FC_GR_HOLD[$idx]+=" $pid"
        elif [[ ${FC_COMM[$pid]} == nvidia-persiste* ]]; then
            FC_GR_PERSISTENCED[$idx]=$pid
        fi
    done < <(fc_open_fds /dev/nvidia)
}

# The leaked GPUs (FC_GR_LEAKS, with FC_GR_MIB[index]) once every selected GPU above the
# threshold is held (FC_GR_HELD names them) or has not fallen for opt_quiet_ms with no
# holder, or opt_wait_ms have passed (then the quiet ones only).
fc_gr_leaks() {
    local t0 now idx settled
    local -A since=() last=()
    fc_now_us
    t0=$REPLY
    while :; do
        fc_gr_read || return 1
        fc_gr_holders
        fc_now_us
        now=$REPLY
        FC_GR_LEAKS=() FC_GR_HELD="" settled=1
        declare -gA FC_GR_MIB=()
        for idx in "${!FC_GR_USED[@]}"; do
            [[ ${FC_GR_USED[$idx]} =~ ^[0-9]+$ ]] || continue
            ((FC_GR_USED[$idx] > opt_max_used_mib)) || continue
            if [[ -n ${FC_GR_APPS[$idx]:-}${FC_GR_HOLD[$idx]:-} ]]; then
                FC_GR_HELD+=" GPU$idx (${FC_GR_APPS[$idx]:-}${FC_GR_HOLD[$idx]:-} )"
                unset "since[$idx]"
                continue
            fi
            if [[ -z ${since[$idx]:-} ]] || ((FC_GR_USED[$idx] < last[$idx])); then
                since[$idx]=$now
            fi
            last[$idx]=${FC_GR_USED[$idx]}
            # --check waits for nothing: a GPU nobody holds is what a run would reset if
            # its memory stays.
            if ((FC_CHECK || (now - since[$idx]) / 1000 >= opt_quiet_ms)); then
                FC_GR_LEAKS+=("$idx")
                FC_GR_MIB[$idx]=${FC_GR_USED[$idx]}
            else
                settled=0
            fi
        done
        ((settled || FC_CHECK || (now - t0) / 1000 >= opt_wait_ms)) && break
        fc_nap 0.1
    done
    if ((${#FC_GR_LEAKS[@]})); then
        mapfile -t FC_GR_LEAKS < <(printf '%s\n' "${FC_GR_LEAKS[@]}" | sort -n)
    fi
    return 0
}

# Reset GPU $1, having checked once more, just before, that nobody but protected daemons
# holds it. Refused for "In use by another client" with nvidia-persistenced holding it:
# persistence off for that GPU, reset, persistence back on, whatever happens.
fc_gr_reset() {
    local idx=$1 out rc note=""
    fc_gr_read || { fc_rec reset "$FC_IDX" "$idx" failed "$FC_MESSAGE"; return 1; }
    fc_gr_holders
    if [[ -n ${FC_GR_APPS[$idx]:-}${FC_GR_HOLD[$idx]:-} ]]; then
        fc_rec reset "$FC_IDX" "$idx" refused \
            "held by${FC_GR_APPS[$idx]:-}${FC_GR_HOLD[$idx]:-} since it was found: not reset"
        return 1
    fi
    fc_gr_smi --gpu-reset -i "$idx"
    rc=$?
    out=$REPLY
    if ((rc != 0)) && [[ $out == *"In use by another client"* && -n ${FC_GR_PERSISTENCED[$idx]:-} &&
        ${FC_GR_PM[$idx]} == Enabled ]]; then
        fc_gr_persistence_off "$idx" || {
            fc_rec reset "$FC_IDX" "$idx" failed "nvidia-smi -pm 0 -i $idx: $REPLY"
            return 1
        }
        fc_gr_smi --gpu-reset -i "$idx"
        rc=$?
        out=$REPLY
        fc_gr_persistence_restore
        note="; persistence mode off for the reset, then on again ($REPLY)"
    fi
    out=${out//$'\n'/ }
    if ((rc == 0)); then
        fc_rec reset "$FC_IDX" "$idx" ok "${FC_GR_MIB[$idx]} MiB freed$note"
        return 0
    fi
    fc_rec reset "$FC_IDX" "$idx" failed "nvidia-smi --gpu-reset exit $rc: $out$note"
    return 1
}

# fc_smi for a reset or a change of persistence mode, which a real GPU may take seconds
# over: waited for two minutes, or smi_timeout where that is longer.
fc_gr_smi() {
    local FC_SMI_TIMEOUT=$FC_SMI_TIMEOUT
    ((${FC_SMI_TIMEOUT%.*} >= 120)) || FC_SMI_TIMEOUT=120
    fc_smi "$@"
}

# Persistence mode off for GPU $1, with a trap that turns it on again if the script is
# interrupted or ends before fc_gr_persistence_restore does (REPLY: the error, if any).
fc_gr_persistence_off() {
    FC_GR_PM_OFF=$1
    trap 'fc_gr_persistence_restore; fc_journal_end' EXIT
    if [[ -n $FC_JOURNAL_FD ]]; then
        # A teardown that keeps a journal goes on without its controller (lib.sh), and so
        # does the reset, which turns persistence on again itself.
        trap fc_gone HUP PIPE
    else
        trap 'fc_gr_persistence_restore; trap - EXIT; exit 129' HUP
        trap 'fc_gr_persistence_restore; trap - EXIT; exit 141' PIPE
    fi
    trap 'fc_gr_persistence_restore; trap - EXIT; exit 130' INT
    trap 'fc_gr_persistence_restore; trap - EXIT; exit 143' TERM
    fc_gr_smi --persistence-mode=0 -i "$1" && return 0
    fc_gr_persistence_restore
    return 1
}

# Persistence mode back on for the GPU fc_gr_persistence_off turned off (if any), traps
# cleared; REPLY says how it went. Writes no record: it may run with stdout gone.
fc_gr_persistence_restore() {
    fc_traps
    [[ -n ${FC_GR_PM_OFF:-} ]] || return 0
    if fc_gr_smi --persistence-mode=1 -i "$FC_GR_PM_OFF"; then
        REPLY="restored"
    else
        REPLY="NOT restored: ${REPLY%%$'\n'*}; run nvidia-smi -pm 1 -i $FC_GR_PM_OFF"
    fi
    FC_GR_PM_OFF=""
}
