# shellcheck shell=bash disable=SC2034,SC2004,SC2153
# (The FC_* tables are declared, associative, in lib.sh, which the linter does not read
# with this file.)
# fleetclean stage library, second part: the targets of the stages that signal (signal,
# gpu-holders): matching, their trees, escalation to SIGKILL, what survives it, what may
# respawn. Rendered after lib.sh, whose records, process table and self-exclusion it uses,
# into the scripts of playbooks that signal; a status script does without it.

# ---------------------------------------------------------------------------- matching
# PIDs whose identity (lib-ident.sh; MODE cmdline: whole command line) matches ERE $1
# (and, if set, ERE $2); sets FC_HITS and, per hit, FC_WHY (the part that matched: title,
# executable, module, script, code or cmdline).
declare -gA FC_WHY=()
fc_match() {
    local pattern=$1 filter=${2:-} mode=${3:-identity} pid rc subject
    FC_HITS=()
    FC_WHY=()
    [[ "" =~ $pattern ]]
    rc=$?
    if ((rc == 2)); then
        FC_MESSAGE="invalid regular expression: $pattern"
        return 2
    fi
    for pid in "${FC_PIDS[@]}"; do
        [[ -n ${FC_CMD[$pid]} ]] || continue
        fc_subject "$pid" "$mode"
        subject=$REPLY
        [[ $subject =~ $pattern ]] || continue
        if [[ -n $filter ]]; then
            [[ $subject =~ $filter ]] || continue
        fi
        FC_HITS+=("$pid")
        FC_WHY[$pid]=$FC_PART
    done
    return 0
}

# What PID's pattern is matched against (REPLY) and which part that is (FC_PART).
fc_subject() {
    if [[ $2 == cmdline ]]; then
        REPLY=${FC_CMD[$1]} FC_PART=cmdline
    else
        REPLY=${FC_IDENT[$1]:-} FC_PART=${FC_IDPART[$1]:-}
    fi
}

# Why PID is a target: the part its own match was on, "gpu" (gpu-holders), else "tree"
# (a descendant, or in a process group or session a match leads).
fc_why() {
    REPLY=${FC_WHY[$1]:-tree}
}

# The same, for a person: "module: python3 -m sglang.launch_server", "tree", plus why a
# match of a stage with scope: related belongs to the server.
fc_why_text() {
    fc_why "$1"
    case $REPLY in
        tree | gpu | cmdline) ;;
        *) REPLY+=": ${FC_IDENT[$1]:-}" ;;
    esac
    [[ -n ${FC_RELWHY[$1]:-} ]] && REPLY+="; ${FC_RELWHY[$1]}"
}

# fc_members PID: what PID's tree takes one step down (FC_MEMBERS): its children, and the
# members of the process group and the session it leads (SGLang's workers outlive their
# parent and are reparented, in its group still).
fc_members() {
    local p=$1 q
    FC_MEMBERS=()
    for q in "${FC_PIDS[@]}"; do
        [[ $q != "$p" ]] || continue
        if [[ ${FC_PPID[$q]} == "$p" ]] ||
            [[ ${FC_PGRP[$p]} == "$p" && ${FC_PGRP[$q]} == "$p" ]] ||
            [[ ${FC_SID[$p]} == "$p" && ${FC_SID[$q]} == "$p" ]]; then
            FC_MEMBERS+=("$q")
        fi
    done
}

# Add descendants, and the members of process groups and sessions that a target leads
# (fc_members), to the PIDs given; drop protected ones. Sets FC_TARGETS (sorted
# numerically, unique).
fc_expand() {
    local -A seen=()
    local -a queue=("$@")
    local p
    while ((${#queue[@]})); do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        [[ -n ${seen[$p]:-} || -z ${FC_START[$p]:-} ]] && continue
        # A protected process is neither a target nor a way to reach one: the shell that
        # started the teardown has the pattern in its argv, but its children are not ours.
        fc_protected "$p" && continue
        seen[$p]=1
        fc_members "$p"
        queue+=("${FC_MEMBERS[@]}")
    done
    fc_keep_unprotected "${!seen[@]}"
}

fc_keep_unprotected() {
    local p
    FC_TARGETS=()
    for p in "$@"; do
        fc_protected "$p" && continue
        [[ -n ${FC_START[$p]:-} ]] || continue
        # Dead is dead: a zombie, or a process already in its exit (no command line).
        [[ ${FC_STATE[$p]} == [ZX] || -z ${FC_CMD[$p]} ]] && continue
        FC_TARGETS+=("$p")
    done
    if ((${#FC_TARGETS[@]})); then
        mapfile -t FC_TARGETS < <(printf '%s\n' "${FC_TARGETS[@]}" | sort -n -u)
    fi
}

# ---------------------------------------------------------------------------- escalation
# fc_escalate SIGNAL GRACE_MS KILL_WAIT_MS PID...: send SIGNAL, poll until gone or the
# grace ends, then SIGKILL what is left (and any new child of it) and poll again.
# Sets FC_SIGNALLED, FC_REMAINING, FC_LEFT (pids).
fc_escalate() {
    local sig=$1 grace_ms=$2 kill_ms=$3
    shift 3
    local -A start=() cmd=()
    local p
    for p in "$@"; do
        start[$p]=${FC_START[$p]}
        cmd[$p]=${FC_CMD[$p]}
    done
    FC_SIGNALLED=0
    fc_note_respawn_risk "$@"
    fc_send "$sig" "$@"
    fc_wait_gone "$grace_ms" "$@"
    if ((${#FC_LEFT[@]})) && [[ $sig != KILL ]]; then
        # New children forked during the grace period die with their parents.
        fc_scan
        local -a live=()
        for p in "${FC_LEFT[@]}"; do
            [[ ${FC_START[$p]:-} == "${start[$p]}" ]] && live+=("$p")
        done
        fc_expand "${live[@]}"
        for p in "${FC_TARGETS[@]}"; do
            [[ -n ${start[$p]:-} ]] || { start[$p]=${FC_START[$p]}; cmd[$p]=${FC_CMD[$p]}; }
        done
        fc_send KILL "${FC_TARGETS[@]}"
        fc_wait_gone "$kill_ms" "${FC_TARGETS[@]}"
    fi
    FC_REMAINING=${#FC_LEFT[@]}
}

# A GPU holder whose parent we leave alive may be started again by it (a supervisor,
# systemd's Restart=): remember that parent, and which processes existed before the
# signal, so that the verification can wait out a settle time and then tell a restarted
# child from an old one (fc_respawned). A holder whose whole tree goes (an SGLang server
# and its workers) needs neither.
fc_note_respawn_risk() {
    local -A targeted=()
    local p q parent
    for p in "$@"; do
        targeted[$p]=1
    done
    for p in "$@"; do
        parent=${FC_PPID[$p]:-0}
        [[ -n ${targeted[$parent]:-} ]] && continue
        fc_holds_gpu "$p" || continue
        fc_owner_may_restart "$p" "$parent" || continue
        if ((!FC_RESPAWN_RISK)); then
            FC_RESPAWN_RISK=1
            for q in "${FC_PIDS[@]}"; do
                FC_BEFORE[$q]=${FC_START[$q]}
            done
        fi
        # PID 1 is watched too (systemd restarts services); what is watched for is a new
        # child running the same program, so that an unrelated job started meanwhile is
        # not taken for a respawn.
        ((parent > 0)) && FC_WATCH[$parent]+="|${FC_COMM[$p]}|"
    done
}

# True (REPLY names it) when a watched parent has a child, running the program of a holder
# we killed, that did not exist before the signal: that holder is being started again.
fc_respawned() {
    local q parent
    ((${#FC_WATCH[@]} + ${#FC_WATCH_OWNER[@]})) || return 1
    fc_scan
    for q in "${FC_PIDS[@]}"; do
        parent=${FC_PPID[$q]}
        [[ ${FC_WATCH[$parent]:-} == *"|${FC_COMM[$q]}|"* ]] || continue
        [[ ${FC_BEFORE[$q]:-} == "${FC_START[$q]}" || ${FC_STATE[$q]} == [ZX] ]] && continue
        REPLY="pid $q (${FC_CMD[$q]}) started by pid $parent (${FC_CMD[$parent]:-?})"
        return 0
    done
    fc_owner_respawned
}

# True when PID has a /dev/nvidiaN open: that N where $2 gives it, else any. (A process
# whose main thread has ended holds its files in its living threads: FC_LIVE_DIR.)
fc_holds_gpu() {
    # One match over the whole listing, read in blocks and escaped (fc_open_fds says why).
    fc_output fc_ls "/proc/${FC_LIVE_DIR[$1]:-$1}/fd"
    if [[ -n ${2:-} ]]; then
        [[ $REPLY == *" -> /dev/nvidia$2"$'\n'* ]]
    else
        [[ $REPLY == *" -> /dev/nvidia"[0-9]* ]]
    fi
}

# True when PID may use the memory of GPU $2 (any GPU where not given): it has that GPU's
# file open and /dev/nvidia-uvm, which every CUDA context opens. An NVML user (a
# monitoring agent, nvidia-smi itself) has every GPU's file open and no /dev/nvidia-uvm.
fc_uses_gpu() {
    fc_holds_gpu "$@" && [[ $REPLY == *" -> /dev/nvidia-uvm"$'\n'* ]]
}

# Signal each (pid, starttime) still alive; one "signal" record each.
fc_send() {
    local sig=$1 p
    shift
    for p in "$@"; do
        fc_alive "$p" "${start[$p]}" "${cmd[$p]}" || continue
        if kill -s "$sig" "$p" 2>/dev/null; then
            FC_SIGNALLED=$((FC_SIGNALLED + 1))
            fc_why "$p"
            fc_rec signal "$FC_IDX" "$p" "$sig" "${cmd[$p]}" "$REPLY" "${FC_IDENT[$p]:-}"
            fc_now_us
            FC_LAST_SIGNAL_US=$REPLY
        elif fc_alive "$p" "${start[$p]}" "${cmd[$p]}"; then
            fc_deny "$p"
        fi
    done
}

# Not permitted to signal PID (see "rights" in lib.sh): list it with its user, and make
# fc_alive never match it again, so that fc_wait_gone and the KILL pass it by.
fc_deny() {
    fc_deny_list "$1" "${cmd[$1]}"
    start[$1]=denied
}

# List PID (command line $2) with its user among those this login may not signal.
fc_deny_list() {
    fc_proc_user "$1"
    FC_DENIED+=("$1 $2 ($REPLY)")
    FC_DENIED_ANY=1
}

# Whether kill(2) would let this login signal PID: root may signal any process; any other
# caller (without CAP_KILL) only one whose real or saved uid is its real or effective uid.
# An unreadable status says yes: the run itself then finds out. For --check, which must
# not say "would send TERM" of a process the run will be refused (another user's server).
fc_may_signal() {
    ((EUID == 0)) && return 0
    fc_proc_uids "$1" || return 0
    local real=${FC_UIDS[0]} saved=${FC_UIDS[2]}
    [[ $UID == "$real" || $UID == "$saved" || $EUID == "$real" || $EUID == "$saved" ]]
}

# Poll every 10 ms until every (pid, starttime) is gone or MS pass; FC_LEFT = survivors.
fc_wait_gone() {
    local ms=$1 p t0 now
    shift
    fc_now_us
    t0=$REPLY
    while :; do
        FC_LEFT=()
        for p in "$@"; do
            fc_alive "$p" "${start[$p]}" "${cmd[$p]}" && FC_LEFT+=("$p")
        done
        ((${#FC_LEFT[@]} == 0)) && return 0
        fc_now_us
        now=$REPLY
        (((now - t0) / 1000 >= ms)) && return 1
        fc_nap 0.01
    done
}

# The shared tail of the stage types that signal (signal, gpu-holders, slurm-job): the
# matches given, with their tree when opt_tree, become FC_TARGETS; their owners are named
# (owner.sh), then they are refused, stopped through their owner or signalled with the
# stage's opt_signal, opt_grace_ms and opt_kill_wait_ms.
# shellcheck disable=SC2154  # opt_* are assigned by the rendered script
fc_signal_hits() {
    if ((opt_tree)); then
        fc_expand "$@"
    else
        fc_keep_unprotected "$@"
    fi
    fc_owner_records "${FC_TARGETS[@]}"
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
}

# Signal-or-list the targets (FC_TARGETS); what fc_signal_hits ends with.
fc_act_on_targets() {
    local sig=$1 grace_ms=$2 kill_ms=$3 p owner
    local -a fresh=()
    fc_note_related "${FC_TARGETS[@]}"
    if ((FC_CHECK)); then
        # In a real run an earlier stage would already have stopped these: list each
        # process under the first stage that would act on it, not under every stage.
        for p in "${FC_TARGETS[@]}"; do
            [[ -n ${FC_CLAIMED[$p]:-} ]] || fresh+=("$p")
            FC_CLAIMED[$p]=1
        done
        FC_TARGETS=("${fresh[@]}")
    fi
    FC_MATCHED=${#FC_TARGETS[@]}
    for p in "${FC_TARGETS[@]}"; do
        fc_why "$p"
        fc_rec match "$FC_IDX" "$p" "${FC_CMD[$p]}" "$REPLY" "${FC_IDENT[$p]:-}"
    done
    if ((FC_MATCHED == 0)); then
        FC_STATUS=ok
        FC_MESSAGE="nothing to signal"
        return 0
    fi
    # Refused, or stopped through their owner (owner-act.sh): FC_TARGETS keeps the rest.
    fc_owner_act "$sig" "$grace_ms" "$kill_ms"
    if ((FC_CHECK)); then
        # What the run would be refused is listed as the run lists it (fc_report_denied).
        fresh=()
        for p in "${FC_TARGETS[@]}"; do
            if fc_may_signal "$p"; then
                fresh+=("$p")
            else
                fc_deny_list "$p" "${FC_CMD[$p]}"
            fi
        done
        FC_TARGETS=("${fresh[@]}")
        FC_STATUS=changed
        FC_MESSAGE="${FC_OWNER_SAID}would signal ${#FC_TARGETS[@]} process(es) with $sig"
        for p in "${FC_TARGETS[@]}"; do
            fc_owner_words "$p"
            owner=$REPLY
            fc_why_text "$p"
            fc_rec change "$FC_IDX" "would send $sig to $p (${FC_CMD[$p]})$owner [$REPLY]"
        done
        return 0
    fi
    fc_escalate "$sig" "$grace_ms" "$kill_ms" "${FC_TARGETS[@]}"
    fc_owner_merge
    FC_STATUS=ok
    FC_MESSAGE="$FC_SIGNALLED signal(s) sent; all $((FC_MATCHED - FC_OWNER_KEPT)) gone"
    ((FC_REMAINING)) && fc_survivors
    FC_MESSAGE="$FC_OWNER_SAID$FC_MESSAGE"
    return 0
}

# What outlived SIGKILL (FC_LEFT). A process in state D waits in the kernel (a driver
# request it cannot abandon): no signal reaches it, so it is stuck, not a failure of this
# stage; it gets a "stuck" record and the verification names it where it holds a GPU.
# Anything else that lives on (SIGKILL refused: another user's process) fails the stage.
fc_survivors() {
    local p stuck="" other="" n=0
    for p in "${FC_LEFT[@]}"; do
        if fc_read_stat "$p" && [[ ${FC_F[0]} == D ]]; then
            FC_STUCK[$p]=${FC_F[19]}
            fc_rec stuck "$FC_IDX" "$p" "${FC_CMD[$p]:-}"
            stuck+=" pid $p (${FC_CMD[$p]:-})"
        else
            n=$((n + 1))
            other+=" pid $p (${FC_CMD[$p]:-})"
        fi
    done
    FC_MESSAGE="$FC_SIGNALLED signal(s) sent"
    if [[ -n $stuck ]]; then
        FC_MESSAGE+="; stuck in the kernel (state D) after SIGKILL:$stuck: reboot or reset needed"
    fi
    if ((n)); then
        FC_STATUS=failed
        FC_MESSAGE+="; $n process(es) survived SIGKILL:$other"
    fi
}
