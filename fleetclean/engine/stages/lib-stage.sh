# shellcheck shell=bash disable=SC2034,SC2004
# (FC_CMD, FC_PPID, ... are lib.sh's associative arrays, keyed by PID.)
# What a script with stages needs beyond lib.sh: the whole process table (fc_scan), the
# stage driver (fc_stage, with the rights it reports) and the "left" records of the end.
# A script with no stage (status) goes without: bash parses every line it is sent.

# Every process but the kernel's threads into the table. Those have no command line, hold
# no GPU and are nobody's target or parent, and a real 8-GPU node runs a thousand or more
# (workers per CPU); a simulated node shows none (its own PID namespace). Reading each
# one's stat only to skip it was most of a stage's time on a real node: kthreadd's children
# are skipped unread (fc_kthreads), and one started since is left out by its stat's flags.
fc_scan() {
    FC_PPID=() FC_PGRP=() FC_SID=() FC_START=() FC_STATE=() FC_COMM=() FC_ARGV0=() FC_CMD=()
    FC_PIDS=() FC_LIVE_DIR=()
    local d pid
    fc_kthreads
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [[ -z ${FC_KTHREAD[$pid]:-} ]] || continue
        fc_proc_fill "$pid" && ((!(FC_F[6] & FC_PF_KTHREAD))) && FC_PIDS+=("$pid")
    done
    return 0
}

# FC_KTHREAD: PID 2 and its children where PID 2 is kthreadd (a kernel thread: this is the
# machine's own PID namespace), from one read of its children (Linux 3.5+ with
# CONFIG_PROC_CHILDREN, as the distributions build it; without, every thread is read). Made
# anew at each scan: a PID is reused only once the kernel's counter has gone round. Not all
# of kthreadd's children are threads: the kernel's user-mode helpers (a core_pattern pipe
# such as systemd-coredump or apport, the uevent helper, poweroff) run as its children while
# they last. Skipped with them: short-lived, holding no GPU, and no teardown's target.
declare -gA FC_KTHREAD=()
fc_kthreads() {
    local k IFS=' '
    local -a kids=()
    FC_KTHREAD=()
    fc_read_stat 2 && ((FC_F[6] & FC_PF_KTHREAD)) || return 0
    { read -r -a kids </proc/2/task/2/children; } 2>/dev/null
    FC_KTHREAD[2]=1
    for k in "${kids[@]}"; do FC_KTHREAD[$k]=1; done
}

# fc_stage INDEX NAME TYPE: run fc_stage_TYPE and report one "end" record for it.
fc_stage() {
    FC_IDX=$1
    local name=$2 type=$3 fn t0
    FC_STAGE_NAME=$name
    fc_rec stage "$FC_IDX" "$name" "$type"
    fc_release
    if ((FC_HALT)); then
        fc_rec end "$FC_IDX" skipped 0 0 0 0 "not run: $FC_HALT_REASON"
        return 0
    fi
    FC_STATUS=ok FC_MATCHED=0 FC_SIGNALLED=0 FC_REMAINING=0 FC_MESSAGE=""
    FC_DENIED=()
    fc_now_us
    t0=$REPLY
    fn=fc_stage_${type//-/_}
    "$fn"
    fc_report_denied
    # What the gpu-holders stage read for the verification (the GPUs, or where nvidia-smi
    # failed, the kernel log alone) is forgotten once a stage may have changed a GPU.
    if ((${FC_VKEPT:-0} || ${FC_VXIDREAD:-0})) && ! fc_gpus_untouched "$type"; then
        fc_verify_drop
    fi
    fc_now_us
    # Held until the next stage's record, the verification's or fc_finish's end: fc_main
    # only sets options in between.
    fc_hold
    fc_rec end "$FC_IDX" "$FC_STATUS" "$FC_MATCHED" "$FC_SIGNALLED" "$FC_REMAINING" \
        "$(((REPLY - t0) / 1000))" "$FC_MESSAGE"
}

# True when a stage of type $1 that just ran left the GPUs as the read kept for the
# verification saw them (verify.sh: fc_verify_keep): it ended ok (a failure may be
# nvidia-smi's, a GPU lost since), sent no signal since that read began (a signal stage's
# or gpu-holders' only way to change a GPU), and is a type that changes none otherwise; a
# gpu-reset that found no leak and no GPU held reset nothing, and saw nothing the read did
# not. Any other type (a shell command, a job cancelled, a unit stopped) may have.
fc_gpus_untouched() {
    [[ $FC_STATUS == ok ]] || return 1
    ((FC_LAST_SIGNAL_US < FC_VKEPT_US)) || return 1
    case $1 in
        guard | restore | remove | signal | gpu-holders) return 0 ;;
        gpu-reset) ((FC_MATCHED == 0)) && [[ -z ${FC_GR_HELD:-} ]] ;;
        *) return 1 ;;
    esac
}

# The user name of PID's real uid (REPLY), from /proc/PID/status; "?" when unreadable.
fc_proc_user() {
    if ! fc_proc_uids "$1"; then
        REPLY="?"
        return 0
    fi
    # shellcheck disable=SC2153  # lib.sh's
    fc_user_name "${FC_UIDS[0]}"
}

# After a stage: what it may not signal makes it "denied" (or is added to its failure).
fc_report_denied() {
    local d list=""
    ((${#FC_DENIED[@]})) || return 0
    for d in "${FC_DENIED[@]}"; do
        list+="${list:+, }$d"
    done
    if [[ $FC_STATUS == ok ]]; then
        FC_STATUS=denied
        FC_MESSAGE="$FC_SIGNALLED signal(s) sent; not permitted: $list"
    else
        # --check ("changed") is denied as its run would be; a failure stays one.
        [[ $FC_STATUS == changed ]] && FC_STATUS=denied
        FC_MESSAGE+="; not permitted: $list"
    fi
}

# "left" records: each parent of GPU holders we killed that is neither protected nor a
# target and lives on (a vLLM API server whose workers are gone, a launcher that will
# respawn them), with its ancestors in its process group: the server a person would stop.
# One record per process, the top of each chain first: pid, command line.
fc_report_left() {
    local p a q
    local -A named=()
    ((${#FC_WATCH[@]})) || return 0
    fc_scan
    for p in "${!FC_WATCH[@]}"; do
        [[ -n ${FC_START[$p]:-} && ${FC_STATE[$p]} != [ZX] ]] || continue
        fc_protected "$p" && continue
        local -a chain=("$p")
        a=$p
        while q=${FC_PPID[$a]:-0}; [[ -n ${FC_START[$q]:-} && ${FC_PGRP[$q]} == "${FC_PGRP[$p]}" ]] &&
            ! fc_protected "$q"; do
            chain=("$q" "${chain[@]}")
            a=$q
        done
        for a in "${chain[@]}"; do
            [[ -n ${named[$a]:-} ]] && continue
            named[$a]=1
            fc_rec left "$a" "${FC_CMD[$a]}"
        done
    done
}
