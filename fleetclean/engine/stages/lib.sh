# shellcheck shell=bash disable=SC2034
# fleetclean stage library: records, process table, self-exclusion, matching, escalation.
#
# Only bash builtins, coreutils, procps/psmisc and flock are used: nodes have no Python.
# Every value the renderer supplies arrives as a quoted assignment (opt_*, FC_*) and is
# only ever read as "$var"; nothing here evaluates a value as code.

# ---------------------------------------------------------------------------- records
# One record per line on stdout: "@@fleetclean" TAB kind TAB field..., each field
# percent-encoded (% TAB LF CR) so command lines and messages cannot break the framing.
fc_enc() {
    local s=$1
    s=${s//%/%25}
    s=${s//$'\t'/%09}
    s=${s//$'\n'/%0A}
    s=${s//$'\r'/%0D}
    REPLY=$s
}

fc_rec() {
    local out="@@fleetclean" f
    for f in "$@"; do
        fc_enc "$f"
        out+=$'\t'$REPLY
    done
    printf '%s\n' "$out"
    # A script no controller reads (fleetclean export: standalone.sh) logs and judges
    # its own records as they are written.
    if ((FC_TAP)); then
        fc_tap "$out" "$@"
    fi
}
FC_TAP=0

# ---------------------------------------------------------------------------- time
# Microseconds since the epoch, from a builtin (no date(1) fork per poll).
fc_now_us() {
    REPLY=${EPOCHREALTIME//[!0-9]/}
}

# Sleep $1 seconds without forking: read on a pipe nobody writes to times out.
fc_nap() {
    if [[ -n ${FC_NAP_FD:-} ]]; then
        read -r -t "$1" -u "$FC_NAP_FD" _ || :
    else
        sleep "$1"
    fi
}

# ---------------------------------------------------------------------------- process table
declare -gA FC_PPID=() FC_PGRP=() FC_SID=() FC_START=() FC_STATE=() FC_COMM=() FC_ARGV0=() FC_CMD=()
declare -ga FC_PIDS=()

# Read one /proc/PID/stat; sets FC_F (fields from 3 on) and REPLY (comm). Fails if gone.
fc_read_stat() {
    local stat
    { IFS= read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
    [[ -n $stat ]] || return 1
    REPLY=${stat#*\(}
    REPLY=${REPLY%\)*}
    # comm may hold spaces and parentheses: split only after the last ')'.
    read -r -a FC_F <<<"${stat##*) }"
}

# Full command line of PID (NULs as spaces); empty for kernel threads and the gone.
# Empty trailing elements are dropped: setproctitle leaves its title NUL-padded.
fc_cmdline() {
    local -a argv=()
    { mapfile -d '' -t argv <"/proc/$1/cmdline"; } 2>/dev/null || :
    while ((${#argv[@]})) && [[ -z ${argv[-1]} ]]; do unset 'argv[-1]'; done
    FC_ARGV0_ONE=${argv[0]:-}
    local IFS=' '
    REPLY="${argv[*]}"
}

fc_scan() {
    FC_PPID=() FC_PGRP=() FC_SID=() FC_START=() FC_STATE=() FC_COMM=() FC_ARGV0=() FC_CMD=()
    FC_PIDS=()
    local d pid comm
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        fc_read_stat "$pid" || continue
        comm=$REPLY
        fc_cmdline "$pid"
        FC_CMD[$pid]=$REPLY
        FC_ARGV0[$pid]=$FC_ARGV0_ONE
        FC_COMM[$pid]=$comm
        FC_STATE[$pid]=${FC_F[0]}
        FC_PPID[$pid]=${FC_F[1]}
        FC_PGRP[$pid]=${FC_F[2]}
        FC_SID[$pid]=${FC_F[3]}
        # Field 22 of stat: with the PID it names one process for its whole life.
        FC_START[$pid]=${FC_F[19]}
        FC_PIDS+=("$pid")
    done
}

# Is the process that was (pid, starttime) still alive? Zombies hold no GPU: gone.
fc_alive() {
    fc_read_stat "$1" || return 1
    [[ ${FC_F[19]} == "$2" && ${FC_F[0]} != Z && ${FC_F[0]} != X ]]
}

# ---------------------------------------------------------------------------- self-exclusion
declare -gA FC_ANCESTOR=()
FC_SELF_SID=0

# The script, its ancestors up to PID 1 (so the sshd serving it) and its session.
fc_self_init() {
    local pid=$BASHPID
    FC_ANCESTOR=()
    while [[ -n $pid && $pid != 0 ]]; do
        FC_ANCESTOR[$pid]=1
        [[ $pid == 1 ]] && break
        fc_read_stat "$pid" || break
        pid=${FC_F[1]}
    done
    fc_read_stat "$BASHPID" && FC_SELF_SID=${FC_F[3]}
}

fc_in_list() {
    local needle=$1 x
    shift
    for x in "$@"; do
        [[ $x == "$needle" ]] && return 0
    done
    return 1
}

# Why PID must never be signalled (REPLY), or failure if it may be.
fc_protected() {
    local pid=$1 base
    REPLY=""
    if [[ $pid == 1 ]]; then
        REPLY="pid 1"
    elif [[ -n ${FC_ANCESTOR[$pid]:-} || $pid == "$BASHPID" || $pid == "$$" ]]; then
        REPLY="the teardown itself or its ancestor"
    elif [[ $FC_SELF_SID != 0 && ${FC_SID[$pid]:-} == "$FC_SELF_SID" ]]; then
        # Session 0: the leader lives outside our PID namespace and tells us nothing.
        REPLY="in the teardown's own session"
    elif [[ -z ${FC_CMD[$pid]:-} && ${FC_PPID[$pid]:-} == 2 ]]; then
        REPLY="kernel thread"
    else
        base=${FC_ARGV0[$pid]:-}
        base=${base##*/}
        if fc_in_list "${FC_COMM[$pid]:-}" "${FC_PROTECT[@]}" || { [[ -n $base ]] && fc_in_list "$base" "${FC_PROTECT[@]}"; }; then
            REPLY="protected name"
        fi
    fi
    # --user, --gpus, an epilog's job (scope.sh): outside the scope is as good as protected.
    if [[ -z $REPLY ]] && ((FC_SCOPED)); then
        fc_out_of_scope "$pid"
    fi
    [[ -n $REPLY ]]
}
FC_SCOPED=0

# ---------------------------------------------------------------------------- matching
# PIDs whose full command line matches ERE $1 (and, if set, ERE $2); sets FC_HITS.
fc_match() {
    local pattern=$1 filter=${2:-} pid rc
    FC_HITS=()
    [[ "" =~ $pattern ]]
    rc=$?
    if ((rc == 2)); then
        FC_MESSAGE="invalid regular expression: $pattern"
        return 2
    fi
    for pid in "${FC_PIDS[@]}"; do
        [[ -n ${FC_CMD[$pid]} ]] || continue
        [[ ${FC_CMD[$pid]} =~ $pattern ]] || continue
        if [[ -n $filter ]]; then
            [[ ${FC_CMD[$pid]} =~ $filter ]] || continue
        fi
        FC_HITS+=("$pid")
    done
    return 0
}

# Add descendants, and the members of process groups and sessions that a target leads
# (SGLang's workers outlive their parent and are reparented), to the PIDs given; drop
# protected ones. Sets FC_TARGETS (sorted numerically, unique).
fc_expand() {
    local -A seen=()
    local -a queue=("$@")
    local p q
    while ((${#queue[@]})); do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        [[ -n ${seen[$p]:-} || -z ${FC_START[$p]:-} ]] && continue
        # A protected process is neither a target nor a way to reach one: the shell that
        # started the teardown has the pattern in its argv, but its children are not ours.
        fc_protected "$p" && continue
        seen[$p]=1
        for q in "${FC_PIDS[@]}"; do
            [[ -n ${seen[$q]:-} ]] && continue
            if [[ ${FC_PPID[$q]} == "$p" ]] ||
                [[ ${FC_PGRP[$p]} == "$p" && ${FC_PGRP[$q]} == "$p" ]] ||
                [[ ${FC_SID[$p]} == "$p" && ${FC_SID[$q]} == "$p" ]]; then
                queue+=("$q")
            fi
        done
    done
    fc_keep_unprotected "${!seen[@]}"
}

fc_keep_unprotected() {
    local p
    FC_TARGETS=()
    for p in "$@"; do
        fc_protected "$p" && continue
        [[ -n ${FC_START[$p]:-} ]] || continue
        [[ ${FC_STATE[$p]} == Z ]] && continue
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
    ((${#FC_WATCH[@]})) || return 1
    fc_scan
    for q in "${FC_PIDS[@]}"; do
        parent=${FC_PPID[$q]}
        [[ ${FC_WATCH[$parent]:-} == *"|${FC_COMM[$q]}|"* ]] || continue
        [[ ${FC_BEFORE[$q]:-} == "${FC_START[$q]}" ]] && continue
        REPLY="pid $q (${FC_CMD[$q]}) started by pid $parent (${FC_CMD[$parent]:-?})"
        return 0
    done
    return 1
}

# True when PID has a /dev/nvidiaN open.
fc_holds_gpu() {
    local line
    while IFS= read -r line; do
        [[ $line == *" -> /dev/nvidia"[0-9]* ]] && return 0
    done < <(LC_ALL=C ls -l "/proc/$1/fd" 2>/dev/null)
    return 1
}

# Signal each (pid, starttime) still alive; one "signal" record each.
fc_send() {
    local sig=$1 p
    shift
    for p in "$@"; do
        fc_alive "$p" "${start[$p]}" || continue
        if kill -s "$sig" "$p" 2>/dev/null; then
            FC_SIGNALLED=$((FC_SIGNALLED + 1))
            fc_rec signal "$FC_IDX" "$p" "$sig" "${cmd[$p]}"
            fc_now_us
            FC_LAST_SIGNAL_US=$REPLY
        fi
    done
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
            fc_alive "$p" "${start[$p]}" && FC_LEFT+=("$p")
        done
        ((${#FC_LEFT[@]} == 0)) && return 0
        fc_now_us
        now=$REPLY
        (((now - t0) / 1000 >= ms)) && return 1
        fc_nap 0.01
    done
}

# Signal-or-list the targets (FC_TARGETS); the shared tail of signal and gpu-holders.
fc_act_on_targets() {
    local sig=$1 grace_ms=$2 kill_ms=$3 p
    local -a fresh=()
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
        fc_rec match "$FC_IDX" "$p" "${FC_CMD[$p]}"
    done
    if ((FC_MATCHED == 0)); then
        FC_STATUS=ok
        FC_MESSAGE="nothing to signal"
        return 0
    fi
    if ((FC_CHECK)); then
        FC_STATUS=changed
        FC_MESSAGE="would signal $FC_MATCHED process(es) with $sig"
        for p in "${FC_TARGETS[@]}"; do
            fc_rec change "$FC_IDX" "would send $sig to $p (${FC_CMD[$p]})"
        done
        return 0
    fi
    fc_escalate "$sig" "$grace_ms" "$kill_ms" "${FC_TARGETS[@]}"
    if ((FC_REMAINING)); then
        FC_STATUS=failed
        FC_MESSAGE="$FC_REMAINING process(es) survived SIGKILL:"
        for p in "${FC_LEFT[@]}"; do
            FC_MESSAGE+=" pid $p (${FC_CMD[$p]:-})"
        done
    else
        FC_STATUS=ok
        FC_MESSAGE="$FC_SIGNALLED signal(s) sent; all $FC_MATCHED gone"
    fi
}

# ---------------------------------------------------------------------------- open files
# "PID FD TARGET" for every open descriptor whose target starts with $1, from one
# `ls -l` over /proc/*/fd (bash has no readlink builtin; one fork, not one per fd).
fc_open_fds() {
    local prefix=$1 line pid="" left fd target
    while IFS= read -r line; do
        case $line in
            /proc/*/fd:)
                pid=${line#/proc/}
                pid=${pid%/fd:}
                ;;
            l*" -> "*)
                left=${line%% -> *}
                fd=${left##* }
                target=${line#* -> }
                [[ $target == "$prefix"* ]] && printf '%s %s %s\n' "$pid" "$fd" "$target"
                ;;
        esac
    done < <(LC_ALL=C QUOTING_STYLE=literal ls -l /proc/[0-9]*/fd 2>/dev/null)
}

# ---------------------------------------------------------------------------- stage driver
FC_HALT=0
FC_IDX=0
FC_LAST_SIGNAL_US=0
FC_RESPAWN_RISK=0
declare -A FC_WATCH=() FC_BEFORE=()
declare -A FC_CLAIMED=()

# fc_stage INDEX NAME TYPE: run fc_stage_TYPE and report one "end" record for it.
fc_stage() {
    FC_IDX=$1
    local name=$2 type=$3 fn t0
    FC_STAGE_NAME=$name
    fc_rec stage "$FC_IDX" "$name" "$type"
    if ((FC_HALT)); then
        fc_rec end "$FC_IDX" skipped 0 0 0 0 "not run: $FC_HALT_REASON"
        return 0
    fi
    FC_STATUS=ok FC_MATCHED=0 FC_SIGNALLED=0 FC_REMAINING=0 FC_MESSAGE=""
    fc_now_us
    t0=$REPLY
    fn=fc_stage_${type//-/_}
    "$fn"
    fc_now_us
    fc_rec end "$FC_IDX" "$FC_STATUS" "$FC_MATCHED" "$FC_SIGNALLED" "$FC_REMAINING" \
        "$(((REPLY - t0) / 1000))" "$FC_MESSAGE"
}

# Drop the previous stage's options so a stage never sees another's values.
fc_reset_opts() {
    local v
    for v in "${!opt_@}"; do
        unset "$v"
    done
}

# A directory only this user can write to, for the lock: /run/lock and /tmp are
# world-writable, where another user could hold the lock file or plant a symlink there.
fc_lock_dir() {
    local d
    for d in /run/fleetclean-lock "${XDG_RUNTIME_DIR:+$XDG_RUNTIME_DIR/fleetclean-lock}" \
        "/tmp/fleetclean-lock-$EUID"; do
        [[ -n $d ]] || continue
        mkdir -m 0700 "$d" 2>/dev/null
        if [[ -d $d && ! -L $d && -O $d ]]; then
            REPLY=$d
            return 0
        fi
    done
    return 1
}

# Take the per-host lock; "busy" if another run holds it past lock_wait seconds.
fc_lock() {
    if ! fc_lock_dir; then
        fc_rec lock none ""
        return 0
    fi
    FC_LOCK_PATH=$REPLY/lock
    if ! command -v flock >/dev/null 2>&1; then
        fc_rec lock none "$FC_LOCK_PATH"
        return 0
    fi
    if ! exec 9>>"$FC_LOCK_PATH"; then
        fc_rec lock none "$FC_LOCK_PATH"
        return 0
    fi
    if flock -w "$FC_LOCK_WAIT" 9; then
        fc_rec lock ok "$FC_LOCK_PATH"
        return 0
    fi
    fc_rec lock busy "$FC_LOCK_PATH"
    return 1
}

fc_begin() {
    # In braces: a bare `exec ... 2>/dev/null` would send the script's stderr to /dev/null
    # for good, and with it every later error message of bash and of the tools it runs.
    { exec {FC_NAP_FD}<> <(:); } 2>/dev/null || FC_NAP_FD=""
    fc_rec begin 1 "$FC_PLAYBOOK" "$FC_HOST" "$FC_CHECK"
    fc_self_init
    # A read-only run (status, --check) changes nothing, so it races with nobody: it must
    # not wait behind a teardown that holds the lock.
    if ((FC_CHECK)); then
        fc_rec lock none ""
        return 0
    fi
    fc_lock
}

fc_finish() {
    fc_rec "done" 0
}
