# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Verification: poll nvidia-smi until every GPU uses at most opt_max_used_mib MiB, or
# opt_timeout_ms pass, or nothing is left to wait for: every GPU above it is a driver-level
# leak (memory no unprotected process holds, not fallen for opt_leak_quiet_ms) or is held
# only by processes stuck in the kernel since SIGKILL. Then report the GPU rows and, where
# some GPU is in use, who uses it. The "verify" record names the rule that ended it:
# clean, leak, stuck, refused (held only by targets left to their owner), respawn,
# deadline, or error (nvidia-smi failed).

# Ask for the pending-remap fields too; a driver that does not know them gets the basic
# query from then on (fc_verify_read_csv).
FC_VQ_PENDING=",retired_pages.pending,remapped_rows.pending"

# The -q read's sections (verify.py: VERIFY_Q_SECTIONS): the row remapper's is added by
# fc_verify_gate, unless the kernel log shows it cannot say Yes. FC_VECC_RE (verify.py:
# ECC_XID_RE) is an Xid of an ECC event, after which a remap or retirement may be pending.
FC_VQ_SECTIONS=MEMORY,PIDS,ROW_REMAPPER
FC_VECC_RE='NVRM: Xid \([^)]*\): (48|63|64|92|94|95|140|154),'
# What of dmesg's output reaches bash (verify.py: KERNEL_LOG_SED): its first line and the
# driver's Xid lines, not the rest of a boot log, every byte of which bash's read and
# matches would go over one at a time.
FC_VKLOG_SED='1{p;d;};/NVRM: Xid/p'
# The levels that hold the driver's Xid lines and the log's first line (verify.py:
# KERNEL_LOG_LEVELS), read alone where the kernel's default message level (printk's
# second field) is among them: a boot log is nearly all info, which dmesg need not format.
FC_VKLOG_LEVELS=emerg,alert,crit,err,warn,notice

# The kernel log as the verification reads it: those levels where dmesg can filter them
# (util-linux's; busybox's cannot), else through sed where the node has it (it is not
# among what fleetclean asks of a node), else whole. render.early_reads starts the same.
fc_verify_klog() {
    local level=""
    read -r _ level _ 2>/dev/null </proc/sys/kernel/printk
    if [[ $level == [0-5] ]] && dmesg -l "$FC_VKLOG_LEVELS" 2>/dev/null </dev/null; then
        return 0
    fi
    if command -v sed >/dev/null 2>&1; then
        dmesg 2>/dev/null </dev/null | sed -n "$FC_VKLOG_SED"
    else
        dmesg 2>/dev/null </dev/null
    fi
}

fc_verify() {
    local max=$opt_max_used_mib t0 state settled=0 respawn="" now fd
    local -A leak_since=() leak_used=() exit_since=() exit_used=() exit_run=()
    # An early read's descriptor from the environment is a stranger's (render.early_reads
    # unsets one before it starts its own): never read, never closed.
    for fd in FC_VQFD FC_VGFD FC_VRRFD FC_VXIDFD; do
        [[ -n ${!fd:-} && ${!fd@a} == *x* ]] && unset "$fd"
    done
    fc_rec stage verify verify verify
    fc_release
    if ((FC_HALT)); then
        fc_rec verify skipped "$max" 0 "not run: $FC_HALT_REASON" skipped
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        fc_rec nvsmi 127 "nvidia-smi: command not found"
        fc_rec verify error "$max" 0 "nvidia-smi: command not found" error
        return 0
    fi
    # The kernel log is read once, first: it decides the -q read's sections
    # (fc_verify_gate). A status script's first line started dmesg and the GPU read (-q
    # without the row remapper, or the query: render.early_reads): dmesg is done long before
    # nvidia-smi, so its text is taken now, while nvidia-smi still works; where the log
    # cannot rule a pending remap out, the remapper's section is read beside it, from now. A
    # read kept from the gpu-holders stage (fc_verify_keep) comes with its kernel log,
    # unless it ended more than one poll ago: the verification would have read again by now.
    # Only a clean one is taken: on a real GPU that read is mostly dirty with the memory of
    # the processes killed just before it, still being freed (50 GiB: 0.1-0.2 s on an H200),
    # and explaining a dirty read (the device files of every process) costs more than a new
    # read, which by now may be clean. Its kernel log is kept.
    if ((FC_VKEPT)); then
        fc_now_us
        if (((REPLY - FC_VKEPT_END_US) / 1000 > opt_interval_ms)); then
            fc_verify_drop
        else
            fc_verify_state "$max"
            [[ $REPLY == ok ]] || FC_VKEPT=0
        fi
    fi
    ((FC_VXIDREAD)) || fc_verify_xid_text
    if [[ -n ${FC_VQFD:-} ]]; then
        if [[ $FC_VQ_SECTIONS == *ROW_REMAPPER* ]]; then
            fc_smi_start FC_VRRFD -q -d ROW_REMAPPER
        fi
        # The GPUs' driver files are read once nvidia-smi has answered (fc_verify_read_q),
        # not while it runs: a read of them asks the driver, which may be the hung one
        # nvidia-smi waits in, and a builtin read waiting there cannot be timed out.
    elif [[ -n ${FC_VGFD:-} && $FC_VQ_SECTIONS == *ROW_REMAPPER* ]]; then
        fc_smi_start FC_VRRFD --query-gpu="index$FC_VQ_PENDING" --format=csv,noheader,nounits
    fi
    fc_now_us
    t0=$REPLY
    # The processes the host's last status named, read while the early -q read runs; or,
    # where the node counts CUDA processes (its -q read), what naming them will need.
    if ((FC_CHECK)) && [[ -n ${FC_VQFD:-} ]]; then
        if [[ -n $FC_VHINT ]]; then
            fc_verify_prep
        elif [[ ${FC_UVM:-} == [1-9]* ]]; then
            fc_verify_warm
        fi
    fi
    while :; do
        if ((FC_VKEPT)); then
            FC_VKEPT=0
            FC_VREAD_US=$FC_VKEPT_US
        else
            fc_now_us
            FC_VREAD_US=$REPLY
            fc_verify_read
        fi
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
            fc_verify_apps_close
            break
        fi
        fc_verify_explain
        # The GPUs answered and their processes' read did not (lib.sh: fc_smi_hung).
        if [[ -n $FC_SMI_HUNG ]]; then
            fc_verify_failed "$max" "$t0"
            return 0
        fi
        fc_now_us
        now=$REPLY
        if [[ -z $respawn ]] && fc_verify_settled "$now"; then
            state=$REPLY
            break
        fi
        # A process this login may not signal (fc_deny) leaves the host dirty whatever
        # the GPUs do next: no point in waiting for them.
        ((FC_CHECK || FC_DENIED_ANY || (now - t0) / 1000 >= opt_timeout_ms)) && break
        fc_nap "$opt_interval_s"
    done
    # A supervisor quick enough to restart it before the first read (systemd's 100 ms)
    # never let the GPUs read clean: the deadline says it is still held, this says why.
    if [[ $state == dirty && -z $respawn ]] && ((!FC_CHECK && FC_RESPAWN_RISK)) && fc_respawned
    then
        respawn=$REPLY
    fi
    fc_now_us
    fc_verify_end "$state" "$max" $(((REPLY - t0) / 1000)) "$respawn"
}

# The kernel log and one read of the GPUs, taken by the gpu-holders stage and kept
# (FC_VKEPT=1, where nvidia-smi answered) as the verification's first read: it comes after
# every signal of the stages before it, and the stage driver drops it (fc_verify_drop,
# from lib-stage.sh: fc_stage) after any stage that may have changed a GPU since. Where
# the GPUs read clean the verification then calls no nvidia-smi of its own (25 ms of
# wall and 18 ms of CPU on an H200); where they do not, it reads again as it polls.
# FC_VKEPT_US: when the read began (a signal after it drops it; the settle counts from
# it); FC_VKEPT_END_US: when it ended (its age when the verification starts).
FC_VKEPT=0 FC_VKEPT_US=0 FC_VKEPT_END_US=0
fc_verify_keep() {
    fc_now_us
    FC_VKEPT_US=$REPLY
    fc_verify_xid_text
    fc_verify_read
    fc_verify_apps
    fc_now_us
    FC_VKEPT_END_US=$REPLY
    FC_VKEPT=0
    ((FC_VRC == 0)) && FC_VKEPT=1
    return 0
}

# The kept read and its kernel log (kept even where the read failed or was dirty)
# forgotten: the verification reads both anew (an Xid logged by a kill or a reset since
# belongs to its report).
fc_verify_drop() {
    FC_VKEPT=0 FC_VXIDREAD=0 FC_VXIDTEXT=""
}

# Where a killed GPU holder's parent lives on (see fc_note_respawn_risk), a first clean
# read is confirmed by one begun once opt_settle_ms have passed since the last signal: a
# holder respawned by its supervisor would otherwise pass as clean in the gap between kill
# and restart. The time the targets took to die counts towards it. Counted from when the
# clean read began (FC_VREAD_US), not from now: a read kept from the gpu-holders stage may
# have begun inside the window and been aged past it by the stages after it. True when
# the caller must read again (after the rest of the window, if any is left).
FC_VREAD_US=0
fc_verify_settle() {
    local left wait_s
    ((opt_settle_ms - (FC_VREAD_US - FC_LAST_SIGNAL_US) / 1000 > 0)) || return 1
    fc_verify_apps_close
    fc_now_us
    left=$((opt_settle_ms - (REPLY - FC_LAST_SIGNAL_US) / 1000))
    ((left > 0)) || return 0
    printf -v wait_s '%d.%03d' $((left / 1000)) $((left % 1000))
    fc_nap "$wait_s"
    return 0
}

# nvidia-smi failed: the rows it still gave (one lost GPU, an InfoROM warning) are kept,
# and the controller tells a faulty GPU from a failed tool by the exit status.
fc_verify_failed() {
    fc_verify_apps_close
    fc_verify_rows_out
    fc_verify_xids
    local what="nvidia-smi exit $FC_VRC: $FC_VNOTE"
    if [[ -n $FC_SMI_HUNG ]]; then  # it did not answer (lib.sh: fc_smi_hung)
        FC_VRC=124 FC_VNOTE=$FC_SMI_HUNG what=$FC_SMI_HUNG
    fi
    fc_rec nvsmi "$FC_VRC" "$FC_VNOTE"
    fc_now_us
    fc_rec verify error "$1" $(((REPLY - $2) / 1000)) "$what" error
}

# The state of one read (REPLY): ok, dirty (FC_VOVER: rows above MAX), unknown (a row
# without a number: FC_VNONUM), error (no row at all).
fc_verify_state() {
    local i used unknown=0
    FC_VOVER=() FC_VNONUM=""
    for i in "${!FC_VROWS[@]}"; do
        # Outside the scope (--gpus, an epilog's job: scope.sh), a GPU is shown, not judged.
        if ((FC_SCOPE_GPUS_ON)) && [[ -z ${FC_SCOPE_GPU[${FC_VIDX[$i]}]:-} ]]; then
            continue
        fi
        used=${FC_VUSED[$i]}
        # A glob, not =~: bash compiles a regex at each test (40-50 us).
        if [[ -n $used && $used != *[!0-9]* ]]; then
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

# The records of the end: GPU rows, who uses them (only where some GPU is above the
# threshold: a clean host, what a fleet-wide status mostly sees, reads no process), Xids,
# and the verdict with its rule.
fc_verify_end() {
    local state=$1 max=$2 ms=$3 respawn=$4
    # Held through fc_finish, which follows; what is held goes out before any process is
    # read in /proc (a process stuck in the kernel can hang a read of its command line).
    fc_hold
    fc_verify_rows_out
    if [[ $state == dirty || $state == leak || $state == stuck || $state == refused ]]; then
        fc_verify_report
    fi
    fc_verify_xids
    case $state in
        ok) fc_rec verify ok "$max" "$ms" "every GPU at or under $max MiB" clean ;;
        leak) fc_rec verify dirty "$max" "$ms" \
            "memory held by no process on $FC_VLEAKS after ${ms} ms (driver-level leak)" leak ;;
        stuck) fc_rec verify dirty "$max" "$ms" \
            "held by processes stuck in the kernel since SIGKILL: $FC_VSTUCKON" stuck ;;
        refused) fc_rec verify dirty "$max" "$ms" \
            "held by processes left to their owner (not signalled): $FC_VKEPTON" refused ;;
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
        *)
            # Its words still tell a broken GPU from a failed tool ("No devices were
            # found", which some versions say with exit 0): the controller reads them.
            fc_rec nvsmi "$FC_VRC" "${FC_VNOTE:-$FC_VOUT}"
            fc_rec verify error "$max" "$ms" "nvidia-smi listed no GPU: $FC_VOUT" error
            ;;
    esac
}

# One read of the GPUs (fc_verify_read_q; fc_verify_read_csv from the first read it cannot
# take on). Sets FC_VRC, FC_VOUT, FC_VNOTE (lines that are not rows: warnings, a lost
# GPU), FC_VROWS (5-field lines: index, uuid, name, memory.used, memory.total), FC_VIDX,
# FC_VUUID, FC_VUSED, FC_VMINOR (the N of its /dev/nvidiaN, where known) and FC_VPEND
# ("retired remapped", each Yes/No/[N/A]) by row; the compute apps are FC_VAPPS (CSV lines:
# pid, process_name, used_memory, gpu_uuid), or wait on FC_VAPPFD (fc_verify_apps).
FC_VMODE=q
# The processes a read-only status reads while its early -q read runs (fc_verify_prep),
# each PID:START (its start time: the two name one process for its whole life), set by
# fc_main where the controller has them; never taken from the environment.
FC_VHINT=""
FC_VAPPSLATER=0
fc_verify_read() {
    FC_VREADS=$((FC_VREADS + 1))
    FC_VAPPSLATER=0
    if [[ -n ${FC_VGFD:-} ]]; then
        fc_verify_read_gpus && return 0
        # What that read could not take (a failed call, a lost GPU, [N/A]) -q would not
        # either: straight to the CSV read, as after a failed -q read, not one call more.
        FC_VMODE=csv
    fi
    if [[ $FC_VMODE == q ]] && fc_verify_read_q; then
        return 0
    fi
    FC_VMODE=csv
    fc_verify_read_csv
}

# One `nvidia-smi -q -d MEMORY,PIDS[,ROW_REMAPPER]` (FC_VQ_SECTIONS): each GPU's memory
# used and total, its processes with their memory, its pending row remaps where asked for
# (No where fc_verify_gate left them out), all in one call (the cost of one bare
# --query-gpu: nvidia-smi allows one --query-* per call, and -x not with -d); after an
# early read, the remapper's section may come from a second call (FC_VRRFD), its GPUs
# matched by bus id. The GPU index is its place in the listing (both list by NVML index);
# uuid, name and device minor
# come from the driver's /proc file of its bus id (fc_verify_gpu_info). Fails, setting
# nothing, on anything it does not take for certain: a non-zero exit (a lost GPU, an
# infoROM warning), a value that is not a number ([N/A], N/A), no GPU, fewer GPU blocks
# than "Attached GPUs", a section missing or in a layout not seen on driver 580 (a GPU
# without a row remapper, which may have retired pages this call does not show), no /proc
# file. Retired pages read [N/A]: what the CSV query says on every GPU with a row remapper.
fc_verify_read_q() {
    local out line v n=-1 count=0 sec="" attached="" pid="" type="" name="" i
    local -a used=() total=() pend=() buses=() seen=() app_gpu=() app=()
    local -A at=()
    if [[ -n ${FC_VQFD:-} ]]; then
        # Both pipes read and closed, whichever failed: an unread nvidia-smi would hold
        # the session open.
        fc_verify_early_q FC_VQFD
        i=$?
        out=$REPLY
        if [[ -n ${FC_VRRFD:-} ]]; then
            fc_verify_early_q FC_VRRFD || i=1
            out+=$'\n'$REPLY
        fi
        ((i == 0)) || return 1
    else
        fc_smi -q -d "$FC_VQ_SECTIONS" || return 1
        out=$REPLY
    fi
    fc_lines "$out"
    for line in "${FC_LINES[@]}"; do
        case $line in
            # Most lines are of no interest: those go first (a third of the time).
            "        "[!TUP\ ]* | "            "[!TNU]*) ;;
            "GPU "*)
                [[ -z $pid ]] || return 1
                v=${line#GPU }
                if [[ -z ${at[$v]:-} ]]; then
                    at[$v]=$count
                    buses[count]=$v
                    count=$((count + 1))
                fi
                n=${at[$v]}
                sec=""
                ;;
            "    FB Memory Usage") sec=fb ;;
            "    Remapped Rows") sec=rr ;;
            "    Processes")
                sec="pr"
                seen[n]=1
                ;;
            "    Processes "*": None")
                sec=""
                seen[n]=1
                ;;
            "    "[!\ ]*) sec="" ;;
            "        Total "*) [[ $sec == fb ]] && total[n]=${line#*: } ;;
            "        Used "*) [[ $sec == fb ]] && used[n]=${line#*: } ;;
            "        Pending "*) [[ $sec == rr ]] && pend[n]=${line#*: } ;;
            "        Process ID "*)
                [[ $sec == pr && -z $pid ]] || return 1
                pid=${line#*: } type="" name=""
                ;;
            "            Type "*) type=${line#*: } ;;
            "            Name "*) name=${line#*: } ;;
            "            Used GPU Memory "*)
                v=${line#*: }
                v=${v% MiB}
                [[ $sec == pr && $pid == +([0-9]) && $v == +([0-9]) ]] || return 1
                # What --query-compute-apps lists: compute processes, not graphics-only.
                if [[ $type == *C* ]]; then
                    app_gpu+=("$n")
                    app+=("$pid, $name, $v")
                fi
                pid=""
                ;;
            "Attached GPUs "*) attached=${line#*: } ;;
        esac
    done
    ((count > 0 && attached == count)) && [[ -z $pid ]] || return 1
    local -a rows=() uuids=() minors=()
    for ((i = 0; i < count; i++)); do
        v=${used[i]:-} line=${total[i]:-}
        [[ $FC_VQ_SECTIONS == *ROW_REMAPPER* ]] || pend[i]=No
        [[ ${seen[i]:-} && ${pend[i]:-} == @(Yes|No) && $v == +([0-9])" MiB" &&
            $line == +([0-9])" MiB" ]] || return 1
        fc_verify_gpu_info "${buses[i]}" || return 1
        rows+=("$i, $REPLY, ${v% MiB}, ${line% MiB}")
        uuids+=("${REPLY%%, *}")
        minors+=("$FC_VGPU_MINOR")
        used[i]=${v% MiB}
        pend[i]="[N/A] ${pend[i]}"
    done
    FC_VROWS=("${rows[@]}") FC_VUUID=("${uuids[@]}") FC_VMINOR=("${minors[@]}")
    FC_VIDX=("${!rows[@]}") FC_VUSED=("${used[@]}") FC_VPEND=("${pend[@]}") FC_VAPPS=()
    for i in "${!app[@]}"; do
        FC_VAPPS+=("${app[i]}, ${uuids[app_gpu[i]]}")
    done
    FC_VRC=0 FC_VOUT=$out FC_VNOTE=""
}

# A -q read started early, in the pipe whose descriptor is in the variable named $1
# (FC_VQFD: what a status script's first line started before bash parsed the rest of the
# script, render.early_reads, so that nvidia-smi's wall time overlaps bash's; FC_VRRFD:
# the remapper's section, fc_verify), used by the first read only: REPLY its output as
# $(...) gives it; fails where nvidia-smi failed (the CSV read then asks again, as it does
# after a failed -q call). Its last line is "@" and the exit status.
fc_verify_early_q() {
    local fd=${!1}
    printf -v "$1" ''
    fc_smi_take "$fd"
}

# The GPU read a status script's first line started where the node's kernel counts no CUDA
# process (render.early_reads, FC_VGFD): the --query-gpu pdsh users type, for the rows;
# the compute apps asked for only where some GPU is in use (FC_VAPPSLATER:
# fc_verify_apps), and the device minors (the driver's files, by uuid) only where a holder
# must be looked for (fc_verify_explain). It costs 0.8-1.9 ms of wall less than -q (an
# H100, an H200: benchmarks/RESULTS.md), and a clean host reads no driver file; a GPU in
# use all the same (memory no process holds, a CUDA process started just after the count
# was read) costs its apps' query after this one, a snapshot apart (a process that ends in
# between leaves its memory unexplained: its GPU's device files are then looked through,
# as for a leak). The bus id would have matched the driver's files directly: asking for it
# costs what -q costs. Where the kernel log cannot rule a pending remap out, the pending
# fields were asked for beside it (FC_VRRFD), matched by index. Fails, setting nothing,
# where either call failed or a line is not as asked (the CSV read then asks anew,
# fc_verify_read); both pipes are read and closed whatever happens.
fc_verify_read_gpus() {
    local out rr="" line rc=0 asked=0
    local -a rows=() idx=() uuids=() used=() minors=() pends=()
    local -A pending=()
    fc_verify_early_q FC_VGFD || rc=1
    out=$REPLY
    if [[ -n ${FC_VRRFD:-} ]]; then
        asked=1
        fc_verify_early_q FC_VRRFD || rc=1
        rr=$REPLY
    fi
    ((rc == 0)) || return 1
    fc_lines "$rr"
    for line in "${FC_LINES[@]}"; do
        [[ -n $line ]] || continue
        [[ $line =~ ^([0-9]+),\ ([^,]+),\ ([^,]+)$ ]] || return 1
        pending[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]} ${BASH_REMATCH[3]}"
    done
    fc_lines "$out"
    for line in "${FC_LINES[@]}"; do
        [[ -n $line ]] || continue
        fc_verify_gpu_row "$line" || return 1
        if ((asked)); then
            [[ -n ${pending[${FC_VROW[0]}]:-} ]] || return 1
            pends+=("${pending[${FC_VROW[0]}]}")
        else
            pends+=("[N/A] No")
        fi
        rows+=("$line") idx+=("${FC_VROW[0]}") uuids+=("${FC_VROW[1]}")
        used+=("${FC_VROW[3]}") minors+=("")
    done
    ((${#rows[@]})) || return 1
    FC_VROWS=("${rows[@]}") FC_VIDX=("${idx[@]}") FC_VUUID=("${uuids[@]}")
    FC_VUSED=("${used[@]}") FC_VPEND=("${pends[@]}") FC_VMINOR=("${minors[@]}")
    FC_VAPPS=() FC_VAPPSLATER=1
    FC_VRC=0 FC_VOUT=$out FC_VNOTE=""
}

# FC_VROW = the fields of a --query-gpu row $1 (index, uuid, name, used, total; the name may
# hold commas), as ^([0-9]+), (GPU-[^,]+), (.+), ([0-9]+), ([0-9]+)$ takes them; fails where
# it would not match. Globs and expansions: =~ compiles its regex at each test, 45 us a row
# on the node's wall once nvidia-smi has answered.
FC_VROW=()
fc_verify_gpu_row() {
    local r=$1 i u n m t
    [[ $r == ?*", "?*", "?*", "?*", "?* ]] || return 1
    i=${r%%, *} r=${r#*, }
    u=${r%%, *} r=${r#*, }
    t=${r##*, } r=${r%, *}
    m=${r##*, } n=${r%, *}
    [[ -n $i && $i != *[!0-9]* && $u == GPU-?* && $u != *,* && -n $n &&
        -n $m && $m != *[!0-9]* && -n $t && $t != *[!0-9]* ]] || return 1
    FC_VROW=("$i" "$u" "$n" "$m" "$t")
}

# The driver's facts about the GPU at bus id $1 (as nvidia-smi prints it, 00000000:18:00.0),
# from /proc/driver/nvidia/gpus/0000:18:00.0/information (fc_bus_dir), read once a run
# with builtins: REPLY "uuid, name" (as --query-gpu=uuid,name gives them) and
# FC_VGPU_MINOR. Fails when the file or one of the three is missing.
fc_verify_gpu_info() {
    local bus
    fc_bus_dir "$1"
    bus=$REPLY
    [[ -n ${FC_GPU_INFO[$bus]:-} ]] || fc_gpu_info_load "$bus" || return 1
    FC_VGPU_MINOR=${FC_GPU_INFO[$bus]%% *}
    REPLY=${FC_GPU_INFO[$bus]#* }
}

# FC_VMINOR of row $1 where a read did not give it (the CSV reads): the driver's file
# whose uuid is the row's; left empty where none is (the index then stands for it).
fc_verify_minor_of() {
    fc_minor_of_uuid "${FC_VUUID[$1]}" && FC_VMINOR[$1]=$REPLY
    return 0
}

# REPLY: the device minor (the N of /dev/nvidiaN) of the GPU whose UUID is $1, from the
# driver's files (FC_GPU_INFO, read once); fails where none of them is that GPU's.
fc_minor_of_uuid() {
    local info
    while :; do
        for info in "${FC_GPU_INFO[@]}"; do
            if [[ ${info#* } == "$1, "* ]]; then
                REPLY=${info%% *}
                return 0
            fi
        done
        # Only some files read (those a -q read that failed part way asked for): the rest;
        # none once an nvidia-smi did not answer: a read of them asks the same driver, and
        # a builtin read waiting there has no deadline (lib.sh: fc_smi_hung).
        if ((FC_GPU_INFO_ALL)) || [[ -n $FC_SMI_HUNG ]]; then
            return 1
        fi
        fc_gpu_info_all
    done
}

# The read as it was before -q: the GPU query, the compute apps asked for at the same
# moment by a second nvidia-smi in parallel (the wall time of one call) and read only where
# a GPU is in use (fc_verify_apps); FC_VAPPFD is its output.
fc_verify_read_csv() {
    local out rc line p1 p2 rest basic=index,uuid,name,memory.used,memory.total
    [[ -n $FC_SMI_HUNG ]] || fc_smi_start FC_VAPPFD --no-err \
        --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits
    fc_smi --query-gpu="$basic$FC_VQ_PENDING" --format=csv,noheader,nounits
    rc=$?
    out=$REPLY
    if ((rc == 2)) && [[ -n $FC_VQ_PENDING && $out == *"not a valid field"* ]]; then
        FC_VQ_PENDING=""
        fc_smi --query-gpu="$basic" --format=csv,noheader,nounits
        rc=$?
        out=$REPLY
    fi
    FC_VRC=$rc FC_VOUT=$out FC_VNOTE=""
    FC_VROWS=() FC_VIDX=() FC_VUUID=() FC_VUSED=() FC_VPEND=() FC_VMINOR=() FC_VAPPS=()
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
        FC_VMINOR+=("")
        FC_VPEND+=("$p1 $p2")
    done <<<"$out"
    [[ -n $FC_VNOTE ]] || FC_VNOTE=${out:-"(no output)"}
}

# The compute apps of this read in FC_VAPPS: the CSV read's parallel query waited for and
# closed (once), the -q read's already there.
fc_verify_apps() {
    if ((FC_VAPPSLATER)); then
        FC_VAPPSLATER=0
        fc_smi --no-err --query-compute-apps=pid,process_name,used_memory,gpu_uuid \
            --format=csv,noheader,nounits
        fc_smi_lines $?
        FC_VAPPS=("${FC_LINES[@]}")
        return 0
    fi
    [[ -n ${FC_VAPPFD:-} ]] || return 0
    fc_smi_take "$FC_VAPPFD"  # closed, whatever came
    fc_smi_lines $?
    FC_VAPPS=("${FC_LINES[@]}")
    FC_VAPPFD=""
    fc_verify_apps_close
}

# FC_LINES = the lines of an nvidia-smi's output (REPLY) whatever its exit status $1, which
# says nothing of them (one GPU lost: the others' apps); none where it did not answer (124).
fc_smi_lines() {
    FC_LINES=()
    (($1 == 124)) || fc_lines "$REPLY"
}

# FC_TAPPS: the compute apps to go by. nvidia-smi prints each process's name (its argv[0])
# as it is, so anyone on the node can forge lines of its list, in the CSV and in -q's text
# alike: a process named "x", a newline and "1234,y,1024,GPU-<a real UUID>" lists PID 1234
# as holding that GPU (a teardown as root killed whatever 1234 was; the verification named
# it as the GPU's holder and hid the forger). Where any process's argv[0] or name in the
# table (a teardown's scan, the processes a status read) holds a newline, the list is read
# again without the names: PIDs, memory and UUIDs come from the driver, which no process
# can forge (a failed read lists nobody, and the GPUs in use are looked for by their device
# files). FC_NAMES_NL caches the look until the table changes (fc_scan, fc_proc_fill), and
# FC_TAPPS is worked out once a GPU read (FC_VREADS, fc_verify_read): the explanation and
# the report of one read take the same list, from one name-less nvidia-smi where needed.
FC_NAMES_NL="" FC_VREADS=0 FC_TAPPS_OF=-1
fc_apps_trusted() {
    fc_verify_apps
    if [[ -z $FC_NAMES_NL ]]; then
        FC_NAMES_NL=0
        [[ "${FC_ARGV0[*]}${FC_COMM[*]}" == *$'\n'* ]] && FC_NAMES_NL=1
        FC_TAPPS_OF=-1
    fi
    ((FC_TAPPS_OF == FC_VREADS)) && return 0
    FC_TAPPS_OF=$FC_VREADS
    if ((FC_NAMES_NL)); then
        fc_smi --no-err --query-compute-apps=pid,used_memory,gpu_uuid \
            --format=csv,noheader,nounits
        fc_smi_lines $?
        FC_TAPPS=("${FC_LINES[@]}")
    else
        FC_TAPPS=("${FC_VAPPS[@]}")
    fi
}

# FC_NAPPS: the apps as the "app" records name them: nvidia-smi's list, or where a name
# could forge lines of it (fc_apps_trusted), the list read without names, each named by
# its argv[0] as the table has it, its newlines and commas made "?" (a line of the record).
fc_verify_apps_named() {
    local i pid name
    fc_apps_trusted
    if ((!FC_NAMES_NL)); then
        FC_NAPPS=("${FC_VAPPS[@]}")
        return 0
    fi
    FC_NAPPS=()
    fc_apps_pairs "${FC_TAPPS[@]}"
    for i in "${!FC_APP_PID[@]}"; do
        [[ ${FC_APP_MIB[i]} == +([0-9]) ]] || continue
        pid=${FC_APP_PID[i]}
        name=${FC_ARGV0[$pid]:-[Not Found]}
        name=${name##*/}
        FC_NAPPS+=("$pid, ${name//[$'\n',]/?}, ${FC_APP_MIB[i]}, ${FC_APP_UUID[i]}")
    done
}

fc_verify_apps_close() {
    FC_VAPPSLATER=0
    [[ -n ${FC_VAPPFD:-} ]] || return 0
    exec {FC_VAPPFD}<&-
    FC_VAPPFD=""
}

# The GPU rows as records, and a "pages" record for each GPU with retired pages or
# remapped rows waiting for a reset.
fc_verify_rows_out() {
    local i p
    fc_rec_each gpu "${FC_VROWS[@]}"
    for i in "${!FC_VROWS[@]}"; do
        p=${FC_VPEND[$i]}
        [[ $p == *Yes* ]] && fc_rec pages "${FC_VIDX[$i]}" "${p% *}" "${p#* }"
    done
    return 0
}

# Who holds the GPUs above the threshold (FC_VOVER): the compute apps and, only for a GPU
# whose memory no compute app explains, the holders of its /dev/nvidiaN (N its device
# minor where the read gave it, else its index), from one `ls -l` over every process's
# fds: the expensive part, so a fallback that a busy node whose apps nvidia-smi lists never
# pays. Sets FC_VPIDS[index] (the compute apps' PIDs), FC_VHOLD[index] (device-file holders
# that may use its memory: unprotected CUDA processes) and FC_VPROT[index] (the others:
# protected daemons, NVML users with a device handle and no /dev/nvidia-uvm), each
# " pid pid"; FC_VDEV[index] (N); FC_VBARE (indexes no FC_VHOLD holds).
fc_verify_explain() {
    local i idx pid
    local -A pids_on=() unexplained=()
    declare -gA FC_VON=() FC_VELSE=()
    fc_apps_trusted
    fc_apps_pairs "${FC_TAPPS[@]}"
    for i in "${!FC_APP_PID[@]}"; do
        pids_on[${FC_APP_UUID[i]}]+=" ${FC_APP_PID[i]}"
        FC_VON[${FC_APP_PID[i]}]+=" ${FC_APP_UUID[i]}"
    done
    declare -gA FC_VPIDS=() FC_VHOLD=() FC_VPROT=() FC_VDEV=()
    FC_VBARE=()
    for i in "${FC_VOVER[@]}"; do
        idx=${FC_VIDX[$i]}
        FC_VPIDS[$idx]=${pids_on[${FC_VUUID[$i]}]:-}
        [[ -n ${FC_VPIDS[$idx]} ]] && continue
        [[ -n ${FC_VMINOR[$i]:-} ]] || fc_verify_minor_of "$i"
        unexplained[$idx]=${FC_VMINOR[$i]:-$idx}
    done
    ((${#unexplained[@]})) || return 0
    fc_gpu_files
    for idx in "${!unexplained[@]}"; do
        FC_VDEV[$idx]=${unexplained[$idx]}
        for pid in ${FC_GF[${unexplained[$idx]}]:-}; do
            fc_verify_prep_check "$pid"
            fc_proc_load "$pid" || continue
            # A CUDA process nvidia-smi lists on other GPUs only, or whose kin it lists
            # so (fc_listed_kin), is shown as having the file open, not as who holds the
            # GPU's memory (a driver-level leak beside a job on another GPU).
            if fc_verify_why_not "$pid"; then
                FC_VPROT[$idx]+=" $pid"
            elif fc_uses_other_gpus "$pid" FC_VON " ${FC_GF[${unexplained[$idx]}]:-} "; then
                FC_VELSE[$pid]=$REPLY
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
# (no CUDA context: an NVML user such as a monitoring agent), which no stage signals, or
# one that uses other GPUs (FC_VELSE, from fc_verify_explain).
fc_verify_why_not() {
    if [[ -n ${FC_VELSE[$1]:-} ]]; then
        REPLY=${FC_VELSE[$1]}
        return 0
    fi
    fc_protected "$1" && return 0
    [[ -n ${FC_GF_CUDA[$1]:-} ]] && return 1
    REPLY="no CUDA context"
}

# True, REPLY saying so ("uses GPU1"), when nvidia-smi lists PID on GPUs, or, where it
# does not list PID, its nearest listed kin among the holders of the same device file ($3:
# " pid pid ", fc_listed_kin): called for a GPU whose memory nobody listed explains, so
# none of them is that GPU. CUDA opens every GPU's file it may see (no
# CUDA_VISIBLE_DEVICES, no device cgroup) and uses those it has a context on, each of
# which nvidia-smi lists. $2: the map of PID -> " UUID..." (nvidia-smi's list).
fc_uses_other_gpus() {
    local -n fc_on_map=$2
    local uuid i gpus=""
    FC_KIN=""
    if [[ -n ${fc_on_map[$1]:-} ]]; then
        REPLY=${fc_on_map[$1]}
    else
        fc_listed_kin "$1" "$2" "$3" || return 1
    fi
    for uuid in $REPLY; do
        for i in "${!FC_VUUID[@]}"; do
            [[ ${FC_VUUID[i]} == "$uuid" ]] && gpus+="${gpus:+, }GPU${FC_VIDX[i]}"
        done
    done
    REPLY="uses ${gpus:-other GPUs}"
    [[ -z $FC_KIN ]] || REPLY="kin of pid $FC_KIN, which ${REPLY}"
}

# True when waiting longer cannot change the verdict, REPLY saying why ("leak" or
# "stuck"): every GPU above the threshold is either a confirmed leak (no process holds it
# but protected daemons, and its memory has not fallen for opt_leak_quiet_ms: the window
# restarts at every decrease, so memory still being released is never taken for a leak)
# or held only by processes stuck in the kernel since SIGKILL (fc_survivors), or in an exit
# that has waited there FC_EXIT_QUIET_MS with nothing moving. Uses and updates the caller's
# leak_* and exit_*; sets FC_VLEAKS and FC_VSTUCKON ("GPU5, GPU6").
FC_EXIT_QUIET_MS=5000
fc_verify_settled() {
    local now=$1 i idx used all=1 quiet=$FC_EXIT_QUIET_MS
    local -a pids=()
    local -A bare=() exiting=()
    ((opt_leak_quiet_ms < quiet)) || quiet=$opt_leak_quiet_ms
    for idx in "${FC_VBARE[@]}"; do
        bare[$idx]=1
    done
    FC_VLEAKS="" FC_VSTUCKON="" FC_VKEPTON=""
    for i in "${FC_VOVER[@]}"; do
        idx=${FC_VIDX[$i]}
        used=${FC_VUSED[$i]}
        if [[ -z ${bare[$idx]:-} ]]; then
            unset "leak_since[$idx]" "leak_used[$idx]"
            read -r -a pids <<<"${FC_VPIDS[$idx]:-} ${FC_VHOLD[$idx]:-}"
            if fc_verify_all_stuck "${pids[@]}"; then
                FC_VSTUCKON+="${FC_VSTUCKON:+, }GPU$idx"
            elif fc_verify_all_kept "${pids[@]}"; then
                FC_VKEPTON+="${FC_VKEPTON:+, }GPU$idx"
            elif ((!FC_CHECK)) && fc_verify_all_exiting "${pids[@]}"; then
                # Every holder is in its exit with a thread waiting in the kernel, where a
                # CUDA teardown spends 0.1-2 s. Still so for FC_EXIT_QUIET_MS (at least
                # opt_leak_quiet_ms) with the GPU's memory unchanged and no waiting thread
                # run for a moment, the driver is stuck: no wait frees the GPU. (Waiting
                # out the deadline instead named the process as a live holder.)
                exiting[$idx]=1
                if [[ -z ${exit_since[$idx]:-} || $used != "${exit_used[$idx]}" ||
                    $FC_VEXIT_RUN != "${exit_run[$idx]}" ]]; then
                    exit_since[$idx]=$now
                fi
                exit_used[$idx]=$used exit_run[$idx]=$FC_VEXIT_RUN
                if (((now - exit_since[$idx]) / 1000 >= quiet)); then
                    fc_verify_mark_stuck "${pids[@]}"
                    FC_VSTUCKON+="${FC_VSTUCKON:+, }GPU$idx"
                else
                    all=0
                fi
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
    # A GPU's exit window holds only while every read in it found its holders exiting.
    for idx in "${!exit_since[@]}"; do
        [[ -n ${exiting[$idx]:-} ]] || unset "exit_since[$idx]" "exit_used[$idx]" "exit_run[$idx]"
    done
    REPLY=leak
    [[ -n $FC_VKEPTON ]] && REPLY=refused
    [[ -n $FC_VSTUCKON ]] && REPLY=stuck
    ((all && ${#FC_VOVER[@]}))
}

# True when there is at least one PID and each is stuck or was refused (left to its owner:
# owner-act.sh) and still is: no wait frees such a GPU.
fc_verify_all_kept() {
    local pid
    (($#)) || return 1
    for pid in "$@"; do
        if [[ -n ${FC_REFUSED[$pid]:-} ]] && fc_alive "$pid" "${FC_REFUSED[$pid]}"; then
            continue
        fi
        fc_still_stuck "$pid" || return 1
    done
}

# True when there is at least one PID and each is stuck (see fc_survivors) and still is.
fc_verify_all_stuck() {
    local pid
    (($#)) || return 1
    for pid in "$@"; do
        fc_still_stuck "$pid" || return 1
    done
}

# True when there is at least one PID and each is in an exit that waits in the kernel
# (fc_exit_waits), from the start time the verification read, if it read one (a PID only
# nvidia-smi named is not loaded: fc_proc_load reads a command line). A teardown's only: a
# status reads once, and one read cannot tell a stuck exit from one a moment from its
# end (nor would a busy node's status pay a read of each process). Sets FC_VEXIT_START
# (pid -> start time) and FC_VEXIT_RUN (what their threads in D have run: fc_exit_waits).
declare -gA FC_VEXIT_START=()
FC_VEXIT_RUN=""
# shellcheck disable=SC2153  # FC_EXIT_START and FC_EXIT_RUN are fc_exit_waits's (lib.sh)
fc_verify_all_exiting() {
    local pid
    FC_VEXIT_RUN=""
    (($#)) || return 1
    for pid in "$@"; do
        fc_exit_waits "$pid" "${FC_START[$pid]:-}" || return 1
        FC_VEXIT_START[$pid]=$FC_EXIT_START
        FC_VEXIT_RUN+="$pid=$FC_EXIT_RUN"
    done
}

# The processes given taken for stuck from now on (FC_STUCK), each with a "stuck" record
# naming the command line a stage read before it was killed, where one did.
# shellcheck disable=SC2004,SC2153  # FC_STUCK is associative (lib.sh); FC_IDX the driver's
fc_verify_mark_stuck() {
    local pid
    for pid in "$@"; do
        [[ -n ${FC_STUCK[$pid]:-} ]] && continue
        FC_STUCK[$pid]=${FC_VEXIT_START[$pid]}
        fc_rec stuck "$FC_IDX" "$pid" "${FC_CMD[$pid]:-}"
    done
}

# Records naming who uses the GPUs: "app" (a --query-compute-apps line, or the same fields
# from -q), "proc" (pid, user, command line, why it is protected or empty, stuck) once per
# PID, "holder" (pid, device, command line, protected reason, GPU index) for the fallback,
# "bare" (index, MiB) for each GPU above the threshold that no unprotected process holds.
fc_verify_report() {
    local line pid idx i why
    local -a pids=() apps=()
    local -A named=()
    fc_verify_apps_named
    # nvidia-smi's apps first (in one builtin: fc_rec_each), then each process's records;
    # what is held goes out before any read of /proc that could hang (fc_verify_proc), so
    # that a busy host whose processes were read while its GPU read ran (fc_verify_prep)
    # sends them in one write.
    for line in "${FC_NAPPS[@]}"; do
        [[ $line == +([0-9]),* ]] || continue
        apps+=("$line")
        pid=${line%%,*}
        [[ -n ${named[$pid]:-} ]] && continue
        named[$pid]=1
        pids+=("$pid")
    done
    fc_rec_each app "${apps[@]}"
    for pid in "${pids[@]}"; do
        fc_verify_proc "$pid"
    done
    # Device-file holders (where the apps do not explain a GPU: rare) as they are read.
    fc_release
    for idx in "${!FC_VHOLD[@]}" "${!FC_VPROT[@]}"; do
        for pid in ${FC_VHOLD[$idx]:-} ${FC_VPROT[$idx]:-}; do
            fc_verify_why_not "$pid" || REPLY=""
            why=$REPLY
            fc_rec holder "$pid" "/dev/nvidia${FC_VDEV[$idx]:-$idx}" "${FC_CMD[$pid]:-}" "$why" \
                "$idx"
            [[ -n ${named[$pid]:-} ]] && continue
            named[$pid]=1
            fc_verify_proc "$pid" "$why"
        done
    done
    fc_hold
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
    local pid=$1 stuck="" why="" user=""
    fc_verify_prep_check "$pid"
    # A read of its command line (or an ancestor's) can hang while it is stuck in the
    # kernel: what is held goes out first. A process read before has none left.
    # (A scoped run's protection, worked out now, may read more: its descriptors.)
    if [[ -z ${FC_VREAD[$pid]:-} || (-n ${FC_VUID[$pid]+set} && -z ${FC_VWHY[$pid]+set}) ||
        (-n ${FC_START[$pid]:-} && -z ${FC_OWNER_DONE[$pid]:-}${FC_OWNER_PREP[$pid]:-}) ]]; then
        fc_flush
    fi
    [[ -n ${FC_VREAD[$pid]:-} ]] || fc_verify_proc_read "$pid" "${2+given}"
    # Not there: not in this PID namespace (a container's process), nvidia-smi's pid only.
    if [[ -n ${FC_VUID[$pid]+set} ]]; then
        fc_user_name "${FC_VUID[$pid]}"
        user=$REPLY
        fc_still_stuck "$pid" && stuck=stuck
        if (($# > 1)); then
            why=$2
        else
            [[ -n ${FC_VWHY[$pid]+set} ]] || fc_verify_why "$pid"
            why=${FC_VWHY[$pid]}
        fi
    fi
    # The owner's reads (its ancestors' command lines) before this process's "proc" record:
    # a held record never waits on a read.
    [[ -n ${FC_START[$pid]:-} ]] && fc_owner_records "$pid"
    # Its start time last: with the PID, what its host's next status reads early.
    fc_rec proc "$pid" "$user" "${FC_CMD[$pid]:-}" "$why" "$stuck" "${FC_START[$pid]:-}"
    return 0
}

# What a "proc" record says of PID, read once (FC_VREAD[pid]): FC_VUID[pid] its effective
# user's id (as ps's user column), unset where it is not there, and FC_VWHY[pid] its
# protection (fc_verify_why), unset where not worked out: where the caller gives it ($2
# "given"), or for a process read early ("early") in a scoped run (its scope may read the
# process's descriptors or environment: fc_out_of_scope), which waits for its record.
declare -gA FC_VREAD=() FC_VUID=() FC_VWHY=() FC_VPREP=()
fc_verify_proc_read() {
    local pid=$1 uid=""
    FC_VREAD[$pid]=1
    fc_proc_load "$pid" || return 0
    # /proc/PID belongs to the effective user, so a process of the user running this
    # script costs one stat, not a read of its status file.
    if [[ -O /proc/$pid ]]; then
        uid=$EUID
    elif fc_proc_uids "$pid"; then
        uid=${FC_UIDS[1]}
    fi
    FC_VUID[$pid]=$uid
    [[ ${2:-} == given || (${2:-} == early && $FC_SCOPED != 0) ]] || fc_verify_why "$pid"
}

fc_verify_why() {
    fc_protected "$1" || REPLY=""
    FC_VWHY[$1]=$REPLY
}

# A host whose last status named processes (FC_VHINT: PID:START each, results/lastclean.py)
# most likely runs them still: a read-only status reads each now, with its owner, while
# its early -q read runs, so that naming them once the read lists them costs no wall time
# after it (8 named processes: 7-8 ms of a 40 ms status on a simulated node). The read
# stays the only word on who uses a GPU: a PID it does not list is never named, and what
# was read of one it lists is checked before its records (fc_verify_prep_check). Stops as
# soon as the read has output; a user name is looked up now in /etc/passwd alone (one
# missing there asks the directory service, up to 2 s, after the rows: fc_user_name), so
# that a stale hint never holds the status past the read. A process in uninterruptible sleep, or with an
# ancestor in it, is left for after the GPU rows have gone out (its command line's read
# can hang while it is stuck in the kernel, fc_verify_end), as is any the hint did not
# name. Not covered: a process whose main thread sleeps while another is stuck in the
# kernel holding its memory map, whose command line's read hangs here, before the rows:
# that status reports a timeout without its GPU rows, and the controller drops the hint of
# a host whose status did not end, so the next reads as without one.
fc_verify_prep() {
    local word pid p
    local -A before=()
    for p in "${!FC_START[@]}"; do
        before[$p]=1
    done
    for word in $FC_VHINT; do
        read -t 0 -u "$FC_VQFD" && break
        pid=${word%%:*}
        [[ $word == [1-9]*([0-9]):+([0-9]) && -z ${FC_VREAD[$pid]:-} ]] || continue
        fc_verify_prep_awake "$pid" "${word#*:}" || continue
        FC_VPREP[$pid]=1
        fc_verify_proc_read "$pid" early
        [[ -n ${FC_VUID[$pid]:-} ]] && fc_user_name_local "${FC_VUID[$pid]}"
        [[ -n ${FC_START[$pid]:-} ]] && fc_owner_prep "$pid"
    done
    # Its ancestors, loaded for its owner, may be named too (an app, a holder): checked alike.
    for p in "${!FC_START[@]}"; do
        [[ -n ${before[$p]:-} ]] || FC_VPREP[$p]=1
    done
}

# Readied while the early -q read runs, where the node's kernel counts CUDA processes
# (FC_UVM: render.early_reads) but no process was named last time: what naming the ones the
# read lists needs first, which would otherwise follow the read. The busy tier's
# definitions parsed (fc_lazy: 3.6 ms of an H200 node's CPU), the script's own ancestry
# (fc_self) and the cgroup roots (fc_owner_roots) read. Nothing here asks the driver, which
# may be the hung one nvidia-smi waits in; and a node whose count was one CUDA process
# holding no memory only parsed early what it parses on any busy node.
fc_verify_warm() {
    if [[ ${FC_LAZY_DONE:-} != *"<1>"* ]] && declare -F fc_lazy >/dev/null; then
        fc_lazy 1 fc_verify_warm
    fi
    fc_self
    ((FC_CG_ROOTS_READ)) || fc_owner_roots
}

# True when PID is still the process named last time (its start time START: after a reboot,
# or once it ended, the PID may be another's, which the hint says nothing of) and neither it
# nor any ancestor of it not read yet is in uninterruptible sleep (stat only: a command line
# is read only once none is). A process whose main thread has ended (a zombie leader with
# more than one thread: fc_live_thread) is read by another thread, and a read of its command
# line waits on any thread of it that holds its memory map: not one of its threads may be in
# D.
fc_verify_prep_awake() {
    local p n=0 t
    fc_read_stat "$1" && [[ ${FC_F[19]} == "$2" && ${FC_F[0]} != D ]] || return 1
    p=${FC_F[1]}
    if [[ ${FC_F[0]} == Z ]] && ((FC_F[17] > 1)); then
        for t in "/proc/$1/task/"*; do
            ! fc_read_stat "$1/task/${t##*/}" || [[ ${FC_F[0]} != D ]] || return 1
        done
    fi
    while [[ $p != 0 && $p != 1 && -z ${FC_START[$p]:-} ]] && ((n++ < 64)); do
        fc_read_stat "$p" && [[ ${FC_F[0]} != D ]] || return 1
        p=${FC_F[1]}
    done
}

# Before the records of PID, if it was read early (fc_verify_prep): where it is no longer
# the process read then (gone, its PID taken by another: its start time), or is a zombie
# or in its exit (whose command line a read now gives empty: "exiting" in the table),
# everything read of it is dropped, to be read anew as it is now.
fc_verify_prep_check() {
    [[ -n ${FC_VPREP[$1]:-} ]] || return 0
    unset "FC_VPREP[$1]"
    if fc_read_stat "$1" && [[ ${FC_F[19]} == "${FC_START[$1]:-}" && ${FC_F[0]} != [ZX] ]] &&
        ((!(FC_F[6] & FC_PF_EXITING))); then
        FC_STATE[$1]=${FC_F[0]}
        return 0
    fi
    unset "FC_VREAD[$1]" "FC_VUID[$1]" "FC_VWHY[$1]" "FC_OWNER_PREP[$1]" "FC_START[$1]" \
        "FC_CMD[$1]" "FC_ARGV0[$1]" "FC_COMM[$1]" "FC_STATE[$1]" "FC_PPID[$1]" "FC_PGRP[$1]" \
        "FC_SID[$1]" "FC_LIVE_DIR[$1]"
}

# The kernel log dmesg printed on FC_VXIDFD (its first line and Xid lines: FC_VKLOG_SED;
# started here unless a status script's first line started it), read whole
# (FC_VXIDREAD=1), kept in FC_VXIDTEXT only where it holds an Xid, and the -q read's
# sections decided from it (fc_verify_gate).
FC_VXIDREAD=0 FC_VXIDTEXT=""
fc_verify_xid_text() {
    [[ -n ${FC_VXIDFD:-} ]] || exec {FC_VXIDFD}< <(fc_verify_klog)
    fc_read_fd "$FC_VXIDFD"
    exec {FC_VXIDFD}<&-
    FC_VXIDFD=""
    FC_VXIDREAD=1
    # Searched now, while an early -q read still runs (a regex search: glob's *...*
    # costs 2-3 times as much over a flapping GPU's thousands of Xid lines).
    if [[ $REPLY =~ "NVRM: Xid" ]]; then
        FC_VXIDTEXT=$REPLY
    fi
    fc_verify_gate "$REPLY" "$FC_VXIDTEXT"
}

# FC_VQ_SECTIONS for the kernel log $1 ($2: the same where it holds some Xid, else empty).
# A pending row remap (or page retirement) follows an ECC event, which the driver logs as
# an Xid (FC_VECC_RE); the -q section that shows it costs 5 ms a GPU on an H200 (the read
# with it: 1.3x the bare query; without: 1.05x). It is left out only where the log, whole
# since boot (its first line at 0.000000: neither cleared nor wrapped), holds no such
# Xid; an unreadable log (no root, dmesg_restrict) proves nothing either. Decided once a
# verification: an ECC error logged while a teardown polls is seen by the next run. Not
# covered: a boot that did not reset the GPU (kexec), whose log lost the Xid of a remap
# still pending; a GPU without a row remapper (before Ampere) is judged alike, its
# retirements logged as the same Xids.
fc_verify_gate() {
    FC_VQ_SECTIONS=MEMORY,PIDS,ROW_REMAPPER
    [[ $1 == "[    0.000000]"* ]] || return 0
    [[ -n $2 && $2 =~ $FC_VECC_RE ]] && return 0
    FC_VQ_SECTIONS=MEMORY,PIDS
}

# The NVIDIA driver's Xid lines in the kernel log (read by fc_verify before its first
# poll, where readable): "boot" (the node's boot time, epoch seconds) and one "xid" record
# each (seconds since boot, the line). The controller keeps the hardware ones since the
# host's last run. The lines are split only when some Xid is there.
fc_verify_xids() {
    local out="" line up _
    ((FC_VXIDREAD)) || return 0
    out=$FC_VXIDTEXT
    FC_VXIDREAD=0 FC_VXIDTEXT=""
    [[ -n $out ]] || return 0
    read -r up _ </proc/uptime || return 0
    fc_now_us
    fc_rec boot $((REPLY / 1000000 - ${up%%.*}))
    local -a lines=()
    fc_lines "$out"
    for line in "${FC_LINES[@]}"; do
        [[ $line == *"NVRM: Xid"* ]] && lines+=("$line")
    done
    # The newest ones: a flapping GPU can log thousands.
    local first=$((${#lines[@]} > 50 ? ${#lines[@]} - 50 : 0))
    for line in "${lines[@]:first}"; do
        [[ $line =~ ^\[\ *([0-9]+)\.[0-9]*\]\ (.*)$ ]] || continue
        fc_rec xid "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    done
}
