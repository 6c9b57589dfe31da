# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Verification: poll nvidia-smi until every GPU uses at most opt_max_used_mib MiB, or
# opt_timeout_ms pass, or every GPU above it is a driver-level leak (memory that no
# unprotected process holds and that has not fallen for opt_leak_quiet_ms); then report
# the GPU rows and, where some GPU is in use, who uses it. The "verify" record names the
# rule that ended it: clean, leak, respawn, deadline, or error (nvidia-smi failed).

# Ask for the pending-remap fields too; a driver that does not know them gets the basic
# query from then on (fc_verify_read).
FC_VQ_PENDING=",retired_pages.pending,remapped_rows.pending"

fc_verify() {
    local max=$opt_max_used_mib t0 state line used i over unknown settled=0 left wait_s
    local respawn="" no_number="" now rule
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
    fc_now_us
    t0=$REPLY
    while :; do
        fc_verify_read
        if ((FC_VRC != 0)); then
            # Rows nvidia-smi still gave (one lost GPU, an InfoROM warning) are kept: the
            # controller tells a faulty GPU from a failed tool by the exit status.
            exec {FC_VAPPFD}<&-
            fc_verify_rows_out
            fc_verify_xids
            fc_rec nvsmi "$FC_VRC" "$FC_VNOTE"
            fc_now_us
            fc_rec verify error "$max" "$(((REPLY - t0) / 1000))" \
                "nvidia-smi exit $FC_VRC: $FC_VNOTE" error
            return 0
        fi
        over=0 unknown=0 no_number=""
        FC_VOVER=()
        for i in "${!FC_VROWS[@]}"; do
            used=${FC_VUSED[$i]}
            if [[ $used =~ ^[0-9]+$ ]]; then
                ((used > max)) && { over=$((over + 1)); FC_VOVER+=("$i"); }
            else
                unknown=$((unknown + 1))
                no_number+=" GPU${FC_VIDX[$i]}=${used:-empty}"
            fi
        done
        if ((${#FC_VROWS[@]} == 0)); then
            state=error
        elif ((unknown)); then
            state=unknown
        elif ((over)); then
            state=dirty
        else
            state=ok
        fi
        # Where a killed GPU holder's parent lives on (see fc_note_respawn_risk), a first
        # clean read is confirmed once opt_settle_ms have passed since the last signal: a
        # holder respawned by its supervisor would otherwise pass as clean in the gap
        # between kill and restart. The time the targets took to die counts towards it.
        if [[ $state == ok ]] && ((!FC_CHECK && !settled && FC_RESPAWN_RISK)); then
            settled=1
            fc_now_us
            left=$((opt_settle_ms - (REPLY - FC_LAST_SIGNAL_US) / 1000))
            if ((left > 0)); then
                exec {FC_VAPPFD}<&-
                printf -v wait_s '%d.%03d' $((left / 1000)) $((left % 1000))
                fc_nap "$wait_s"
                continue
            fi
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
        if [[ -z $respawn ]] && fc_verify_leaks "$now"; then
            state=leak
            break
        fi
        ((FC_CHECK || (now - t0) / 1000 >= opt_timeout_ms)) && break
        fc_nap "$opt_interval_s"
    done
    fc_now_us
    local ms=$(((REPLY - t0) / 1000))
    fc_verify_rows_out
    # Who holds the GPUs matters only where some GPU is still in use: a clean host (what a
    # fleet-wide status mostly sees) reads the compute apps it asked for in parallel not at
    # all, and the process table not at all.
    [[ $state == dirty || $state == leak ]] && fc_verify_report
    fc_verify_xids
    case $state in
        ok) fc_rec verify ok "$max" "$ms" "every GPU at or under $max MiB" clean ;;
        leak) fc_rec verify dirty "$max" "$ms" \
            "memory held by no process on $FC_VLEAKS after ${ms} ms (driver-level leak)" leak ;;
        dirty)
            if [[ -n $respawn ]]; then
                fc_rec verify dirty "$max" "$ms" "respawned after it was killed: $respawn" respawn
            else
                fc_rec verify dirty "$max" "$ms" "$over GPU(s) above $max MiB after ${ms} ms" \
                    deadline
            fi
            ;;
        unknown) fc_rec verify unknown "$max" "$ms" \
            "nvidia-smi gave no number for memory.used:$no_number (check the driver: run nvidia-smi on the host)" \
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

# For the GPUs above the threshold (FC_VOVER): the compute apps (read from the parallel
# query) and, only for a GPU whose memory no compute app explains, the /dev/nvidiaN
# holders (one `ls -l` over every process's fds: the expensive part, so a fallback).
# Sets FC_VAPPS (CSV lines), FC_VHOLD[index] and FC_VPROT[index] (unprotected and
# protected device-file holders, "pid pid ..."), FC_VBARE (indexes no unprotected
# process holds).
fc_verify_explain() {
    local line uuid i idx pid target
    local -A used_by_app=() unexplained=()
    mapfile -t FC_VAPPS <&"$FC_VAPPFD"
    exec {FC_VAPPFD}<&-
    for line in "${FC_VAPPS[@]}"; do
        [[ $line =~ ^[0-9]+, ]] || continue
        uuid=${line##*,}
        used_by_app[${uuid//[[:space:]]/}]=1
    done
    declare -gA FC_VHOLD=() FC_VPROT=()
    FC_VBARE=()
    for i in "${FC_VOVER[@]}"; do
        [[ -n ${used_by_app[${FC_VUUID[$i]}]:-} ]] || unexplained[${FC_VIDX[$i]}]=1
    done
    ((${#unexplained[@]})) || return 0
    while read -r pid _ target; do
        idx=${target#/dev/nvidia}
        [[ $idx =~ ^[0-9]+$ && -n ${unexplained[$idx]:-} ]] || continue
        fc_proc_load "$pid" || continue
        if fc_protected "$pid"; then
            [[ " ${FC_VPROT[$idx]:-} " == *" $pid "* ]] || FC_VPROT[$idx]+=" $pid"
        else
            [[ " ${FC_VHOLD[$idx]:-} " == *" $pid "* ]] || FC_VHOLD[$idx]+=" $pid"
        fi
    done < <(fc_open_fds /dev/nvidia)
    for idx in "${!unexplained[@]}"; do
        [[ -n ${FC_VHOLD[$idx]:-} ]] || FC_VBARE+=("$idx")
    done
}

# True when every GPU above the threshold is a confirmed leak: no unprotected process
# holds it and its memory has not fallen for opt_leak_quiet_ms (the window restarts at
# every decrease, so a process's memory being released is never taken for a leak).
# Uses and updates the caller's leak_since/leak_used; sets FC_VLEAKS ("GPU5, GPU6").
fc_verify_leaks() {
    local now=$1 i idx used all=1
    local -A bare=()
    for idx in "${FC_VBARE[@]}"; do
        bare[$idx]=1
    done
    FC_VLEAKS=""
    for i in "${FC_VOVER[@]}"; do
        idx=${FC_VIDX[$i]}
        used=${FC_VUSED[$i]}
        if [[ -z ${bare[$idx]:-} ]]; then
            unset "leak_since[$idx]" "leak_used[$idx]"
            all=0
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
    ((all && ${#FC_VOVER[@]}))
}

# Records naming who uses the GPUs: "app" (nvidia-smi's own line), "proc" (pid, user,
# command line, why it is protected or empty) once per PID, "holder" (pid, device,
# command line, protected reason) for the fallback, "bare" (index, MiB) for each GPU above
# the threshold that no unprotected process holds.
fc_verify_report() {
    local line pid idx i
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
            fc_protected "$pid"
            fc_rec holder "$pid" "/dev/nvidia$idx" "${FC_CMD[$pid]:-}" "$REPLY"
            [[ -n ${named[$pid]:-} ]] && continue
            named[$pid]=1
            fc_verify_proc "$pid"
        done
    done
    for idx in "${FC_VBARE[@]}"; do
        for i in "${!FC_VIDX[@]}"; do
            [[ ${FC_VIDX[$i]} == "$idx" ]] && fc_rec bare "$idx" "${FC_VUSED[$i]}"
        done
    done
}

# One "proc" record: pid, user, command line (NUL padding dropped), protected reason.
fc_verify_proc() {
    local pid=$1 user="" key uid _
    if fc_proc_load "$pid"; then
        while read -r key uid _; do
            [[ $key == Uid: ]] && break
        done <"/proc/$pid/status"
        fc_user_name "$uid"
        user=$REPLY
        fc_protected "$pid" || REPLY=""
    else
        REPLY=""  # not in this PID namespace (a container's process): nvidia-smi's pid
    fi
    fc_rec proc "$pid" "$user" "${FC_CMD[$pid]:-}" "$REPLY"
}

# The process table entries of one PID (what fc_scan fills for all): enough for
# fc_protected without a scan of every process. (The FC_* tables are associative,
# declared in lib.sh, which shellcheck does not see from here.)
# shellcheck disable=SC2004
fc_proc_load() {
    local pid=$1
    [[ -n ${FC_START[$pid]:-} ]] && return 0
    fc_read_stat "$pid" || return 1
    FC_COMM[$pid]=$REPLY
    FC_STATE[$pid]=${FC_F[0]}
    FC_PPID[$pid]=${FC_F[1]}
    FC_PGRP[$pid]=${FC_F[2]}
    FC_SID[$pid]=${FC_F[3]}
    FC_START[$pid]=${FC_F[19]}
    fc_cmdline "$pid"
    FC_CMD[$pid]=$REPLY
    FC_ARGV0[$pid]=$FC_ARGV0_ONE
}

# User name of UID from /etc/passwd, read once (no getent fork per process); the number
# when it has no entry.
declare -gA FC_PASSWD=()
fc_user_name() {
    local name uid _
    if ((${#FC_PASSWD[@]} == 0)); then
        FC_PASSWD[-]=-
        while IFS=: read -r name _ uid _; do
            FC_PASSWD[$uid]=${FC_PASSWD[$uid]:-$name}
        done </etc/passwd 2>/dev/null
    fi
    REPLY=${FC_PASSWD[${1:--}]:-$1}
}

# The NVIDIA driver's Xid lines in the kernel log, where it is readable: "boot" (the
# node's boot time, epoch seconds) and one "xid" record each (seconds since boot, the
# line). The controller keeps the hardware ones since the host's last run. One fork;
# the lines are split only when some Xid is there.
fc_verify_xids() {
    local out line up _
    out=$(dmesg 2>/dev/null) || return 0
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
