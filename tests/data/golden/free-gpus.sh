#!/usr/bin/env bash
# fleetclean 0.1.0: playbook free-gpus (built-in)
# host: "node01"  mode: run
# Runs as `bash -s` with this text on standard input. Records go to stdout as
# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.
# variables:
#   force = false
#   lock_wait = 5
#   max_used_mib = 0
#   protect = []
#   ray_grace = 10
#   reset_leaked = "true"
#   sglang_grace = 10
#   tgi_grace = 15
#   triton_grace = 30
#   trtllm_grace = 15
#   verify_timeout = 30
#   vllm_grace = 15

# [lib.sh: a stage library, pinned by tests/data/golden/lib.sh.sha256]

# [lib-kill.sh: a stage library, pinned by tests/data/golden/lib.sh.sha256]

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "signal": match processes by ERE on the full command line, take their tree
# (descendants, process groups and sessions they lead), signal, poll, escalate to KILL.
# Options: opt_pattern, opt_signal, opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).
fc_stage_signal() {
    local pattern=$opt_pattern
    fc_scan
    fc_match "$pattern" || { FC_STATUS=failed; return 0; }
    if ((opt_tree)); then
        fc_expand "${FC_HITS[@]}"
    else
        fc_keep_unprotected "${FC_HITS[@]}"
    fi
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "gpu-holders": the processes that use GPU memory, minus protected ones; optionally
# only those whose command line matches opt_filter. nvidia-smi's compute apps first; the
# holders of /dev/nvidiaN only for a GPU whose memory no compute app explains (or every
# GPU when nvidia-smi cannot say), and among those only CUDA processes (with
# /dev/nvidia-uvm open): an NVML user (a monitoring agent, nvidia-smi itself) keeps the
# device files open too, uses no GPU memory, and is never a target.
# Options: opt_filter, opt_signal, opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).

# Sets FC_HOLDERS (pid list, may repeat) and FC_NVSMI_NOTE (why device files were read
# for every GPU, or empty).
fc_gpu_holders() {
    local out rc line uuid idx used pid all=0
    local -A explained=() need=()
    FC_HOLDERS=()
    FC_NVSMI_NOTE=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        exec {FC_GH_APPFD}< <(nvidia-smi --query-compute-apps=pid,gpu_uuid \
            --format=csv,noheader,nounits 2>/dev/null)
        out=$(nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits 2>&1)
        rc=$?
        while IFS=', ' read -r line uuid; do
            [[ $line =~ ^[0-9]+$ ]] || continue
            FC_HOLDERS+=("$line")
            explained[$uuid]=1
        done <&"$FC_GH_APPFD"
        exec {FC_GH_APPFD}<&-
        if ((rc == 0)); then
            while IFS=', ' read -r idx uuid used; do
                [[ $idx =~ ^[0-9]+$ && $used =~ ^[0-9]+$ ]] || continue
                ((used > 0)) && [[ -z ${explained[$uuid]:-} ]] && need[$idx]=1
            done <<<"$out"
        else
            FC_NVSMI_NOTE="nvidia-smi exit $rc: ${out%%$'\n'*}; CUDA processes on device files; "
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
            [[ -n ${FC_GF_CUDA[$pid]:-} ]] && FC_HOLDERS+=("$pid")
        done
    done
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
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
    FC_MESSAGE="$FC_NVSMI_NOTE$FC_MESSAGE"
}

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
    exec {FC_GR_APPFD}< <(nvidia-smi --query-compute-apps=pid,gpu_uuid \
        --format=csv,noheader,nounits 2>/dev/null)
    out=$(nvidia-smi --query-gpu=index,uuid,memory.used,persistence_mode \
        --format=csv,noheader,nounits 2>&1)
    rc=$?
    declare -gA FC_GR_USED=() FC_GR_PM=() FC_GR_APPS=()
    if ((rc != 0)); then
        exec {FC_GR_APPFD}<&-
        FC_STATUS=failed
        FC_MESSAGE="nvidia-smi exit $rc: ${out%%$'\n'*}"
        return 1
    fi
    while IFS=', ' read -r idx uuid used pm; do
        [[ $idx =~ ^[0-9]+$ ]] || continue
        [[ $opt_gpus == all || " $opt_gpus " == *" $idx "* ]] || continue
        index_of[$uuid]=$idx
        FC_GR_USED[$idx]=$used
        FC_GR_PM[$idx]=$pm
    done <<<"$out"
    while IFS=', ' read -r line uuid; do
        idx=${index_of[$uuid]:-}
        [[ -n $idx && $line =~ ^[0-9]+$ ]] && FC_GR_APPS[$idx]+=" $line"
    done <&"$FC_GR_APPFD"
    exec {FC_GR_APPFD}<&-
    return 0
}

# Unprotected /dev/nvidiaN holders by index (FC_GR_HOLD[index]: " pid pid") and whether
# nvidia-persistenced is among the protected ones (FC_GR_PERSISTENCED[index]=pid).
fc_gr_holders() {
    local pid target idx
    declare -gA FC_GR_HOLD=() FC_GR_PERSISTENCED=()
    while read -r pid _ target; do
        idx=${target#/dev/nvidia}
        [[ $idx =~ ^[0-9]+$ ]] || continue
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
    out=$(nvidia-smi --gpu-reset -i "$idx" 2>&1)
    rc=$?
    if ((rc != 0)) && [[ $out == *"In use by another client"* && -n ${FC_GR_PERSISTENCED[$idx]:-} &&
        ${FC_GR_PM[$idx]} == Enabled ]]; then
        fc_gr_persistence_off "$idx" || {
            fc_rec reset "$FC_IDX" "$idx" failed "nvidia-smi -pm 0 -i $idx: $REPLY"
            return 1
        }
        out=$(nvidia-smi --gpu-reset -i "$idx" 2>&1)
        rc=$?
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

# Persistence mode off for GPU $1, with a trap that turns it on again if the script is
# interrupted or ends before fc_gr_persistence_restore does (REPLY: the error, if any).
fc_gr_persistence_off() {
    FC_GR_PM_OFF=$1
    trap fc_gr_persistence_restore EXIT
    trap 'fc_gr_persistence_restore; trap - EXIT; exit 129' HUP
    trap 'fc_gr_persistence_restore; trap - EXIT; exit 130' INT
    trap 'fc_gr_persistence_restore; trap - EXIT; exit 141' PIPE
    trap 'fc_gr_persistence_restore; trap - EXIT; exit 143' TERM
    REPLY=$(nvidia-smi --persistence-mode=0 -i "$1" 2>&1) && return 0
    fc_gr_persistence_restore
    return 1
}

# Persistence mode back on for the GPU fc_gr_persistence_off turned off (if any), traps
# cleared; REPLY says how it went. Writes no record: it may run with stdout gone.
fc_gr_persistence_restore() {
    local out
    trap - EXIT HUP INT PIPE TERM
    [[ -n ${FC_GR_PM_OFF:-} ]] || return 0
    if out=$(nvidia-smi --persistence-mode=1 -i "$FC_GR_PM_OFF" 2>&1); then
        REPLY="restored"
    else
        REPLY="NOT restored: ${out%%$'\n'*}; run nvidia-smi -pm 1 -i $FC_GR_PM_OFF"
    fi
    FC_GR_PM_OFF=""
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Verification: poll nvidia-smi until every GPU uses at most opt_max_used_mib MiB, or
# opt_timeout_ms pass, or nothing is left to wait for: every GPU above it is a driver-level
# leak (memory no unprotected process holds, not fallen for opt_leak_quiet_ms) or is held
# only by processes stuck in the kernel since SIGKILL. Then report the GPU rows and, where
# some GPU is in use, who uses it. The "verify" record names the rule that ended it:
# clean, leak, stuck, respawn, deadline, or error (nvidia-smi failed).

# Ask for the pending-remap fields too; a driver that does not know them gets the basic
# query from then on (fc_verify_read).
FC_VQ_PENDING=",retired_pages.pending,remapped_rows.pending"

fc_verify() {
    local max=$opt_max_used_mib t0 state settled=0 respawn="" now
    local -A leak_since=() leak_used=()
    fc_rec stage verify verify verify
    if ((FC_HALT)); then
        fc_rec verify skipped "$max" 0 "not run: $FC_HALT_REASON" skipped
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        fc_rec nvsmi 127 "nvidia-smi: command not found"
        fc_rec verify error "$max" 0 "nvidia-smi: command not found" error
        return 0
    fi
    # The kernel log is read once, beside the first GPU query (its wall time, not after it).
    exec {FC_VXIDFD}< <(dmesg 2>/dev/null)
    fc_now_us
    t0=$REPLY
    while :; do
        fc_verify_read
        if ((FC_VRC != 0)); then
            fc_verify_failed "$max" "$t0"
            return 0
        fi
        fc_verify_state "$max"
        state=$REPLY
        if [[ $state == ok ]] && ((!FC_CHECK && !settled && FC_RESPAWN_RISK)); then
            settled=1
            fc_verify_settle && continue
        fi
        # After the settle, a watched parent with a new child is restarting what we
        # killed, however slowly that child starts: wait for it up to the deadline, and
        # call the host dirty even if it has not taken its GPU yet.
        if [[ $state == ok ]] && ((!FC_CHECK && settled)) && fc_respawned; then
            respawn=$REPLY
            state=dirty
        fi
        if [[ $state != dirty ]]; then
            exec {FC_VAPPFD}<&-
            break
        fi
        fc_verify_explain
        fc_now_us
        now=$REPLY
        if [[ -z $respawn ]] && fc_verify_settled "$now"; then
            state=$REPLY
            break
        fi
        ((FC_CHECK || (now - t0) / 1000 >= opt_timeout_ms)) && break
        fc_nap "$opt_interval_s"
    done
    fc_now_us
    fc_verify_end "$state" "$max" $(((REPLY - t0) / 1000)) "$respawn"
}

# Where a killed GPU holder's parent lives on (see fc_note_respawn_risk), a first clean
# read is confirmed once opt_settle_ms have passed since the last signal: a holder
# respawned by its supervisor would otherwise pass as clean in the gap between kill and
# restart. The time the targets took to die counts towards it. True when it waited (the
# caller reads again).
fc_verify_settle() {
    local left wait_s
    fc_now_us
    left=$((opt_settle_ms - (REPLY - FC_LAST_SIGNAL_US) / 1000))
    ((left > 0)) || return 1
    exec {FC_VAPPFD}<&-
    printf -v wait_s '%d.%03d' $((left / 1000)) $((left % 1000))
    fc_nap "$wait_s"
}

# nvidia-smi failed: the rows it still gave (one lost GPU, an InfoROM warning) are kept,
# and the controller tells a faulty GPU from a failed tool by the exit status.
fc_verify_failed() {
    exec {FC_VAPPFD}<&-
    fc_verify_rows_out
    fc_verify_xids
    fc_rec nvsmi "$FC_VRC" "$FC_VNOTE"
    fc_now_us
    fc_rec verify error "$1" $(((REPLY - $2) / 1000)) "nvidia-smi exit $FC_VRC: $FC_VNOTE" error
}

# The state of one read (REPLY): ok, dirty (FC_VOVER: rows above MAX), unknown (a row
# without a number: FC_VNONUM), error (no row at all).
fc_verify_state() {
    local i used unknown=0
    FC_VOVER=() FC_VNONUM=""
    for i in "${!FC_VROWS[@]}"; do
        used=${FC_VUSED[$i]}
        if [[ $used =~ ^[0-9]+$ ]]; then
            ((used > $1)) && FC_VOVER+=("$i")
        else
            unknown=$((unknown + 1))
            FC_VNONUM+=" GPU${FC_VIDX[$i]}=${used:-empty}"
        fi
    done
    if ((${#FC_VROWS[@]} == 0)); then
        REPLY=error
    elif ((unknown)); then
        REPLY=unknown
    elif ((${#FC_VOVER[@]})); then
        REPLY=dirty
    else
        REPLY=ok
    fi
}

# The records of the end: GPU rows, who uses them (only where some GPU is in use: a clean
# host, what a fleet-wide status mostly sees, reads neither the compute apps it asked for
# in parallel nor the process table), Xids, and the verdict with its rule.
fc_verify_end() {
    local state=$1 max=$2 ms=$3 respawn=$4
    fc_verify_rows_out
    [[ $state == dirty || $state == leak || $state == stuck ]] && fc_verify_report
    fc_verify_xids
    case $state in
        ok) fc_rec verify ok "$max" "$ms" "every GPU at or under $max MiB" clean ;;
        leak) fc_rec verify dirty "$max" "$ms" \
            "memory held by no process on $FC_VLEAKS after ${ms} ms (driver-level leak)" leak ;;
        stuck) fc_rec verify dirty "$max" "$ms" \
            "held by processes stuck in the kernel since SIGKILL: $FC_VSTUCKON" stuck ;;
        dirty)
            if [[ -n $respawn ]]; then
                fc_rec verify dirty "$max" "$ms" "respawned after it was killed: $respawn" respawn
            else
                fc_rec verify dirty "$max" "$ms" \
                    "${#FC_VOVER[@]} GPU(s) above $max MiB after ${ms} ms" deadline
            fi
            ;;
        unknown) fc_rec verify unknown "$max" "$ms" \
            "nvidia-smi gave no number for memory.used:$FC_VNONUM (check the driver: run nvidia-smi on the host)" \
            error ;;
        *) fc_rec verify error "$max" "$ms" "nvidia-smi listed no GPU: $FC_VOUT" error ;;
    esac
}

# One read of the GPUs. The compute apps are asked for at the same moment, by a second
# nvidia-smi in parallel (the wall time of one call), and read only where a GPU is in use
# (fc_verify_explain); FC_VAPPFD is its output. Sets FC_VRC, FC_VOUT, FC_VNOTE (lines
# that are not rows: warnings, a lost GPU), FC_VROWS (5-field lines), FC_VIDX, FC_VUUID,
# FC_VUSED (by row) and FC_VPEND (by row: "retired remapped", each Yes/No/[N/A]).
fc_verify_read() {
    local out rc line p1 p2 rest basic=index,uuid,name,memory.used,memory.total
    exec {FC_VAPPFD}< <(nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid \
        --format=csv,noheader,nounits 2>/dev/null)
    out=$(nvidia-smi --query-gpu="$basic$FC_VQ_PENDING" --format=csv,noheader,nounits 2>&1)
    rc=$?
    if ((rc == 2)) && [[ -n $FC_VQ_PENDING && $out == *"not a valid field"* ]]; then
        FC_VQ_PENDING=""
        out=$(nvidia-smi --query-gpu="$basic" --format=csv,noheader,nounits 2>&1)
        rc=$?
    fi
    FC_VRC=$rc FC_VOUT=$out FC_VNOTE=""
    FC_VROWS=() FC_VIDX=() FC_VUUID=() FC_VUSED=() FC_VPEND=()
    while IFS= read -r line; do
        [[ -n ${line//[[:space:]]/} ]] || continue
        if [[ ! $line =~ ^[0-9]+,\ .*,.*,.*, ]]; then
            FC_VNOTE+="${FC_VNOTE:+ }$line"
            continue
        fi
        p1="" p2=""
        # The two pending fields come last; the name (third) may hold commas, so split
        # from the right, and only where the last field is not memory.total.
        if [[ -n $FC_VQ_PENDING && ! ${line##*, } =~ ^[0-9]+$ ]]; then
            p2=${line##*, }
            rest=${line%, *}
            p1=${rest##*, }
            line=${rest%, *}
        fi
        FC_VROWS+=("$line")
        FC_VIDX+=("${line%%,*}")
        rest=${line#*, }
        FC_VUUID+=("${rest%%,*}")
        rest=${line%,*}
        rest=${rest##*,}
        FC_VUSED+=("${rest//[[:space:]]/}")
        FC_VPEND+=("$p1 $p2")
    done <<<"$out"
    [[ -n $FC_VNOTE ]] || FC_VNOTE=${out:-"(no output)"}
}

# The GPU rows as records, and a "pages" record for each GPU with retired pages or
# remapped rows waiting for a reset.
fc_verify_rows_out() {
    local i p
    for i in "${!FC_VROWS[@]}"; do
        fc_rec gpu "${FC_VROWS[$i]}"
    done
    for i in "${!FC_VROWS[@]}"; do
        p=${FC_VPEND[$i]}
        [[ $p == *Yes* ]] && fc_rec pages "${FC_VIDX[$i]}" "${p% *}" "${p#* }"
    done
    return 0
}

# Who holds the GPUs above the threshold (FC_VOVER): the compute apps (read from the
# parallel query) and, only for a GPU whose memory no compute app explains, the
# /dev/nvidiaN holders (one `ls -l` over every process's fds: the expensive part, so a
# fallback). Sets FC_VAPPS (CSV lines), FC_VPIDS[index] (the compute apps' PIDs),
# FC_VHOLD[index] (device-file holders that may use its memory: unprotected CUDA
# processes) and FC_VPROT[index] (the others: protected daemons, NVML users with a device
# handle and no /dev/nvidia-uvm), each " pid pid"; FC_VBARE (indexes no FC_VHOLD holds).
fc_verify_explain() {
    local line i idx pid
    local -A pids_on=() unexplained=()
    mapfile -t FC_VAPPS <&"$FC_VAPPFD"
    exec {FC_VAPPFD}<&-
    for line in "${FC_VAPPS[@]}"; do
        [[ $line =~ ^([0-9]+),.*,\ *([^,]*)$ ]] || continue
        pids_on[${BASH_REMATCH[2]}]+=" ${BASH_REMATCH[1]}"
    done
    declare -gA FC_VPIDS=() FC_VHOLD=() FC_VPROT=()
    FC_VBARE=()
    for i in "${FC_VOVER[@]}"; do
        idx=${FC_VIDX[$i]}
        FC_VPIDS[$idx]=${pids_on[${FC_VUUID[$i]}]:-}
        [[ -n ${FC_VPIDS[$idx]} ]] || unexplained[$idx]=1
    done
    ((${#unexplained[@]})) || return 0
    fc_gpu_files
    for idx in "${!unexplained[@]}"; do
        for pid in ${FC_GF[$idx]:-}; do
            fc_proc_load "$pid" || continue
            if fc_verify_why_not "$pid"; then
                FC_VPROT[$idx]+=" $pid"
            else
                FC_VHOLD[$idx]+=" $pid"
            fi
        done
    done
    for idx in "${!unexplained[@]}"; do
        [[ -n ${FC_VHOLD[$idx]:-} ]] || FC_VBARE+=("$idx")
    done
}

# Why device-file holder $1 is not taken for a user of the GPU's memory (REPLY), or
# failure when it may be one: a protected process, or one without /dev/nvidia-uvm open
# (no CUDA context: an NVML user such as a monitoring agent), which no stage signals.
fc_verify_why_not() {
    fc_protected "$1" && return 0
    [[ -n ${FC_GF_CUDA[$1]:-} ]] && return 1
    REPLY="no CUDA context"
}

# True when waiting longer cannot change the verdict, REPLY saying why ("leak" or
# "stuck"): every GPU above the threshold is either a confirmed leak (no process holds it
# but protected daemons, and its memory has not fallen for opt_leak_quiet_ms: the window
# restarts at every decrease, so memory still being released is never taken for a leak)
# or held only by processes stuck in the kernel since SIGKILL (fc_survivors). Uses and
# updates the caller's leak_since/leak_used; sets FC_VLEAKS and FC_VSTUCKON ("GPU5, GPU6").
fc_verify_settled() {
    local now=$1 i idx used all=1
    local -a pids=()
    local -A bare=()
    for idx in "${FC_VBARE[@]}"; do
        bare[$idx]=1
    done
    FC_VLEAKS="" FC_VSTUCKON=""
    for i in "${FC_VOVER[@]}"; do
        idx=${FC_VIDX[$i]}
        used=${FC_VUSED[$i]}
        if [[ -z ${bare[$idx]:-} ]]; then
            unset "leak_since[$idx]" "leak_used[$idx]"
            read -r -a pids <<<"${FC_VPIDS[$idx]:-} ${FC_VHOLD[$idx]:-}"
            if fc_verify_all_stuck "${pids[@]}"; then
                FC_VSTUCKON+="${FC_VSTUCKON:+, }GPU$idx"
            else
                all=0
            fi
            continue
        fi
        if [[ -z ${leak_since[$idx]:-} ]] || ((used < leak_used[$idx])); then
            leak_since[$idx]=$now
        fi
        leak_used[$idx]=$used
        if (((now - leak_since[$idx]) / 1000 >= opt_leak_quiet_ms)); then
            FC_VLEAKS+="${FC_VLEAKS:+, }GPU$idx"
        else
            all=0
        fi
    done
    REPLY=leak
    [[ -n $FC_VSTUCKON ]] && REPLY=stuck
    ((all && ${#FC_VOVER[@]}))
}

# True when there is at least one PID and each is stuck (see fc_survivors) and still is.
fc_verify_all_stuck() {
    local pid
    (($#)) || return 1
    for pid in "$@"; do
        [[ -n ${FC_STUCK[$pid]:-} ]] && fc_alive "$pid" "${FC_STUCK[$pid]}" || return 1
    done
}

# Records naming who uses the GPUs: "app" (nvidia-smi's own line), "proc" (pid, user,
# command line, why it is protected or empty, stuck) once per PID, "holder" (pid, device,
# command line, protected reason) for the fallback, "bare" (index, MiB) for each GPU above
# the threshold that no unprotected process holds.
fc_verify_report() {
    local line pid idx i why
    local -A named=()
    for line in "${FC_VAPPS[@]}"; do
        [[ $line =~ ^[0-9]+, ]] || continue
        fc_rec app "$line"
        pid=${line%%,*}
        [[ -n ${named[$pid]:-} ]] && continue
        named[$pid]=1
        fc_verify_proc "$pid"
    done
    for idx in "${!FC_VHOLD[@]}" "${!FC_VPROT[@]}"; do
        for pid in ${FC_VHOLD[$idx]:-} ${FC_VPROT[$idx]:-}; do
            fc_verify_why_not "$pid" || REPLY=""
            why=$REPLY
            fc_rec holder "$pid" "/dev/nvidia$idx" "${FC_CMD[$pid]:-}" "$why"
            [[ -n ${named[$pid]:-} ]] && continue
            named[$pid]=1
            fc_verify_proc "$pid" "$why"
        done
    done
    for idx in "${FC_VBARE[@]}"; do
        for i in "${!FC_VIDX[@]}"; do
            [[ ${FC_VIDX[$i]} == "$idx" ]] && fc_rec bare "$idx" "${FC_VUSED[$i]}"
        done
    done
}

# One "proc" record: pid, user, command line (NUL padding dropped), why it is never
# signalled ($2 when given, else its protection), "stuck" when it is stuck in the kernel
# since SIGKILL.
fc_verify_proc() {
    local pid=$1 user="" line uid="" stuck=""
    local -a status=()
    if fc_proc_load "$pid"; then
        # The effective user, as ps's user column: /proc/PID belongs to it, so a process
        # of the user running this script costs one stat, not a read of its status file.
        if [[ -O /proc/$pid ]]; then
            uid=$EUID
        else
            { mapfile -n 12 -t status <"/proc/$pid/status"; } 2>/dev/null
            for line in "${status[@]}"; do
                # "Uid:<TAB>real<TAB>effective<TAB>saved<TAB>filesystem"
                [[ $line =~ ^Uid:[[:space:]]+[0-9]+[[:space:]]+([0-9]+) ]] || continue
                uid=${BASH_REMATCH[1]}
                break
            done
        fi
        fc_user_name "$uid"
        user=$REPLY
        [[ -n ${FC_STUCK[$pid]:-} ]] && fc_alive "$pid" "${FC_STUCK[$pid]}" && stuck=stuck
        if (($# > 1)); then
            REPLY=$2
        else
            fc_protected "$pid" || REPLY=""
        fi
    else
        REPLY=""  # not in this PID namespace (a container's process): nvidia-smi's pid
    fi
    fc_rec proc "$pid" "$user" "${FC_CMD[$pid]:-}" "$REPLY" "$stuck"
}

# The NVIDIA driver's Xid lines in the kernel log (started by fc_verify, where readable):
# "boot" (the node's boot time, epoch seconds) and one "xid" record each (seconds since
# boot, the line). The controller keeps the hardware ones since the host's last run. The
# lines are split only when some Xid is there.
fc_verify_xids() {
    local out="" line up _
    [[ -n ${FC_VXIDFD:-} ]] || return 0
    IFS= read -r -d '' out <&"$FC_VXIDFD"
    exec {FC_VXIDFD}<&-
    FC_VXIDFD=""
    [[ $out == *"NVRM: Xid"* ]] || return 0
    read -r up _ </proc/uptime || return 0
    fc_now_us
    fc_rec boot $((REPLY / 1000000 - ${up%%.*}))
    local -a lines=()
    while IFS= read -r line; do
        [[ $line == *"NVRM: Xid"* ]] && lines+=("$line")
    done <<<"$out"
    # The newest ones: a flapping GPU can log thousands.
    local first=$((${#lines[@]} > 50 ? ${#lines[@]} - 50 : 0))
    for line in "${lines[@]:first}"; do
        [[ $line =~ ^\[\ *([0-9]+)\.[0-9]*\]\ (.*)$ ]] || continue
        fc_rec xid "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    done
}

fc_main() {
    export LC_ALL=C
    PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    FC_PLAYBOOK=free-gpus
    FC_HOST=node01
    FC_CHECK=0
    FC_FORCE=0
    FC_LOCK_WAIT=5
    FC_PROTECT=(sshd systemd init nvidia-persistenced nv-hostengine dcgm-exporter nv-fabricmanager Xorg)
    if ! fc_begin; then
        fc_rec error "host busy: another fleetclean run holds $FC_LOCK_PATH"
        fc_finish
        return 0
    fi

    # stage 1/9: "stop-sglang" (signal)
    fc_reset_opts
    opt_pattern='sglang\.launch_server|(^|/)sglang serve( |$)'
    opt_signal=TERM
    opt_grace_ms=10000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 1 stop-sglang signal

    # stage 2/9: "stop-vllm" (signal)
    fc_reset_opts
    opt_pattern='vllm\.entrypoints\.|(^|/)vllm serve( |$)'
    opt_signal=TERM
    opt_grace_ms=15000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 2 stop-vllm signal

    # stage 3/9: "stop-trtllm" (signal)
    fc_reset_opts
    opt_pattern='(^|/)trtllm-serve( |$)'
    opt_signal=TERM
    opt_grace_ms=15000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 3 stop-trtllm signal

    # stage 4/9: "stop-triton" (signal)
    fc_reset_opts
    opt_pattern='(^|/)tritonserver( |$)'
    opt_signal=TERM
    opt_grace_ms=30000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 4 stop-triton signal

    # stage 5/9: "stop-tgi" (signal)
    fc_reset_opts
    opt_pattern='(^|/)text-generation-launcher( |$)'
    opt_signal=TERM
    opt_grace_ms=15000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 5 stop-tgi signal

    # stage 6/9: "stop-ray" (signal)
    fc_reset_opts
    opt_pattern='(^|/)ray start( |$)|/raylet/raylet( |$)|/gcs/gcs_server( |$)'
    opt_signal=TERM
    opt_grace_ms=10000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 6 stop-ray signal

    # stage 7/9: "kill-workers" (signal)
    fc_reset_opts
    opt_pattern='^(sglang::|VLLM::|ray::)|(^|/)text-generation-server( |$)|mpi4py\.futures\.server'
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 7 kill-workers signal

    # stage 8/9: "kill-gpu-holders" (gpu-holders)
    fc_reset_opts
    opt_filter=''
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 8 kill-gpu-holders gpu-holders

    # stage 9/9: "reset-leaked" (gpu-reset)
    fc_reset_opts
    opt_enabled=1
    opt_gpus=all
    opt_max_used_mib=0
    opt_quiet_ms=1000
    opt_wait_ms=10000
    fc_stage 9 reset-leaked gpu-reset

    # verify: every GPU at or under max_used_mib before the deadline
    fc_reset_opts
    opt_max_used_mib=0
    opt_timeout_ms=30000
    opt_interval_s=0.05
    opt_settle_ms=1000
    opt_leak_quiet_ms=1000
    fc_verify
    fc_finish
}

fc_main </dev/null
