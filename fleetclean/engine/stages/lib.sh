# shellcheck shell=bash disable=SC2034
# fleetclean stage library: records, time, the process table, self-exclusion, open files,
# the stage driver's state and the lock; every script carries it. lib-stage.sh (the stage
# driver, the whole process table) follows it where there is a stage, lib-kill.sh
# (matching, trees, escalation) in the scripts of playbooks that signal.
#
# Only bash builtins, coreutils, procps/psmisc, flock and getent (libc's) are used: nodes
# have no Python.
# Every value the renderer supplies arrives as a quoted assignment (opt_*, FC_*) and is
# only ever read as "$var"; nothing here evaluates a value as code.

# ---------------------------------------------------------------------------- records
# One record per line on stdout: "@@fleetclean" TAB kind TAB field..., each field
# percent-encoded (% TAB LF CR) so command lines and messages cannot break the framing.
fc_enc() {
    REPLY=$1
    [[ $REPLY == *[%$'\t\n\r']* ]] || return 0
    REPLY=${REPLY//%/%25}
    REPLY=${REPLY//$'\t'/%09}
    REPLY=${REPLY//$'\n'/%0A}
    REPLY=${REPLY//$'\r'/%0D}
}

fc_rec() {
    local out f
    # Most records need no escape: joined in one builtin, they hold no %, CR or LF, and
    # no tab but the $# separators. Only others go field by field through fc_enc (a
    # busy node's status writes 40 records: 1,000 shell commands less).
    printf -v out '\t%s' "$@"
    f=${out//[!$'\t']/}
    if [[ $out == *[%$'\n\r']* ]] || ((${#f} != $#)); then
        out=""
        for f in "$@"; do
            fc_enc "$f"
            out+=$'\t'$REPLY
        done
    fi
    out="@@fleetclean$out"
    fc_put "$out"$'\n'
    # A script no controller reads (fleetclean export: standalone.sh) logs and judges
    # its own records as they are written.
    if ((FC_TAP)); then
        fc_tap "$out" "$@"
    fi
}
FC_TAP=0

# One record of kind $1 for each further argument, a field each, as fc_rec would write them
# one at a time; in one builtin where none needs an escape (an 8-GPU node's eight rows:
# 0.2 ms less of its wall after nvidia-smi answers).
fc_rec_each() {
    local kind=$1 out
    shift
    if ((FC_TAP)) || [[ $kind$* == *[%$'\t\n\r']* ]]; then
        for out in "$@"; do
            fc_rec "$kind" "$out"
        done
        return 0
    fi
    (($#)) || return 0
    # The kind goes into the format (it holds no %, as checked): its \ as itself.
    printf -v out "@@fleetclean\t${kind//\\/\\\\}\t%s\n" "$@"
    fc_put "$out"
}

# Records written together leave together. sshd sends what one read of the pipe gives as
# one packet, and every packet costs the controller (paramiko reads, decrypts and hands
# it on: ~60 us) and the node's sshd its own: a status wrote 13 packets on an idle node and
# 27 on a busy one, a record each. Between fc_hold and fc_release (or fc_flush) records
# are kept in FC_HELD and written at once. Held only where no command can block: a record
# that waits unwritten while the script hangs is lost with the connection. A "stage" record
# releases what is held, so that the controller sees each stage as it starts; a record
# from a subshell (whose FC_HELD dies with it) is written at once.
FC_HOLD=0 FC_HELD=""
# Whole record lines $1, held or written now (fc_write).
fc_put() {
    if ((FC_HOLD && !BASH_SUBSHELL)); then
        FC_HELD+=$1
    else
        fc_write "$1"
    fi
}

fc_hold() {
    FC_HOLD=1
}

fc_flush() {
    [[ -z $FC_HELD ]] || fc_write "$FC_HELD"
    FC_HELD=""
}

fc_release() {
    FC_HOLD=0
    fc_flush
}

# REPLY = all that file descriptor $1 gives until its end. A pipe, most often: `read -d ''`
# and mapfile read a pipe one byte per read(2) (a kernel log of 250 KB: 250,000 system
# calls), `read -N` reads it in blocks.
fc_read_fd() {
    local chunk
    REPLY=""
    while IFS= read -r -N 1048576 chunk <&"$1"; do
        REPLY+=$chunk
    done
    REPLY+=$chunk
}

# ---------------------------------------------------------------------------- nvidia-smi
# Every nvidia-smi call must answer, whole, within FC_SMI_TIMEOUT seconds (smi_timeout).
# A wedged driver (after an Xid 79, 119 or 45, say) leaves nvidia-smi waiting in an ioctl
# the kernel does not cut short: it never answers, and SIGKILL leaves it in state D.
# Unbounded, a status waited for it until the controller's --timeout (300 s) and said only
# "script still running"; a teardown's call had inherited the host's lock, which it then
# held for good. The first call that does not answer is killed (this script's own child)
# and none starts after it: each fails at once (status 124), FC_SMI_HUNG saying why. Each
# runs without the lock's descriptor (9) and with its output in a pipe of its own, so that
# one left in the driver holds nothing of the session's or of a later run's.
FC_SMI_HUNG="" FC_SMI_TIMEOUT=${FC_SMI_TIMEOUT:-30}

# REPLY = all that descriptor $1 gives (fc_read_fd), its first byte waited for
# FC_SMI_TIMEOUT seconds at most; false where it did not come. Every writer of nvidia-smi's
# output sends it whole at its end (o=$(nvidia-smi ...); printf ...), so that a call that
# stops answering part way sends nothing: the rest is read without a deadline, as bash
# reads a pipe under one (read -t) a byte at a time, 15 ms for a -q read's 12 KB.
fc_smi_read() {
    local first
    IFS= read -r -N 1 -t "$FC_SMI_TIMEOUT" first <&"$1"
    case $? in
        0) ;;
        1) REPLY=$first && return 0 ;;  # nothing: its end
        *) REPLY="" && return 1 ;;  # out of time (>128)
    esac
    fc_read_fd "$1"
    REPLY=$first$REPLY
}

# REPLY = the output of nvidia-smi "$@" with its errors (--no-err: without them), the
# status its own; 124 where it did not answer (fc_smi_hung) or an earlier call did not.
fc_smi() {
    if [[ -n $FC_SMI_HUNG ]]; then
        REPLY=$FC_SMI_HUNG
        return 124
    fi
    fc_smi_start REPLY "$@"
    fc_smi_take "$REPLY"
}

# nvidia-smi ${@:2} started, its output (with its errors; --no-err first: without them)
# and then "\n@STATUS" sent whole at its end on a descriptor whose number goes in the
# variable named $1, for fc_smi_take: every nvidia-smi of the script but the early reads
# (render.early_reads, written the same way) is started here. It runs without the lock's
# descriptor (9), the session's standard input or its errors.
fc_smi_start() {
    local fc_smi_to=$1 fc_smi_new
    shift
    if [[ $1 == --no-err ]]; then
        shift
        exec {fc_smi_new}< <(exec 2>/dev/null </dev/null 9>&-; o=$(nvidia-smi "$@")
            printf '%s\n@%d' "$o" "$?")
    else
        exec {fc_smi_new}< <(exec 2>/dev/null </dev/null 9>&-; o=$(nvidia-smi "$@" 2>&1)
            printf '%s\n@%d' "$o" "$?")
    fi
    printf -v "$fc_smi_to" '%s' "$fc_smi_new"
}

# The output on descriptor $1 of an nvidia-smi followed by "\n@STATUS" (fc_smi, the early
# reads of render.early_reads): REPLY the output without its trailing newlines, its status
# returned, the descriptor closed; 124 where it did not come in time (fc_smi_hung).
fc_smi_take() {
    local fd=$1 rc=0
    # After one that did not answer, none is waited for: the driver is hung.
    [[ -n $FC_SMI_HUNG ]] || fc_smi_read "$fd" || rc=1
    exec {fd}<&-
    [[ -z $FC_SMI_HUNG ]] || rc=1
    if ((rc)); then
        [[ -n $FC_SMI_HUNG ]] || fc_smi_hung
        REPLY=$FC_SMI_HUNG
        return 124
    fi
    # From the end, by length: a pattern anchored at one end of 12 KB is tried at every
    # place of it.
    rc=${REPLY: -5}
    ((${#REPLY} >= 5)) || rc=$REPLY
    rc=${rc##*@}
    # No status after it: the shell that ran it ended first (killed, say).
    [[ $rc =~ ^[0-9]+$ && ${REPLY: -${#rc}-2:2} == $'\n@' ]] || return 1
    REPLY=${REPLY:0:${#REPLY}-${#rc}-2}
    while [[ $REPLY == *$'\n' ]]; do REPLY=${REPLY%$'\n'}; done
    return "$rc"
}

# An nvidia-smi of this script's did not answer in time: each one still running (among its
# children and theirs) is sent SIGKILL, and FC_SMI_HUNG says what became of it. One that
# outlives SIGKILL waits in the driver (state D): the driver is hung, and the subshells
# that wait for it (ours, which would wait as long) are killed too. Those of one that did
# end reap it and end themselves (their pipe's reader is gone), leaving no zombie to init.
fc_smi_hung() {
    local p q comm depth stuck="" killed="" note=""
    local -a gen=() below=() kids=() found=() shells=()
    local -A above=()
    # The script's children, theirs, and theirs again: a command substitution in a
    # subshell (render.early_reads' -q read) is a shell of its own where bash does not run
    # its command in place (4.4). above: each one's parent among them, not the script.
    { read -r -a gen </proc/$$/task/$$/children; } 2>/dev/null
    for depth in 1 2 3; do
        below=()
        for p in "${gen[@]}"; do
            comm=""
            { read -r comm </proc/"$p"/comm; } 2>/dev/null
            if [[ $comm == nvidia-smi ]]; then
                found+=("$p")
            elif ((depth < 3)); then
                kids=()
                { read -r -a kids </proc/"$p"/task/"$p"/children; } 2>/dev/null
                for q in "${kids[@]}"; do
                    above[$q]=$p
                    below+=("$q")
                done
            fi
        done
        gen=("${below[@]}")
    done
    ((${#found[@]} == 0)) || kill -KILL "${found[@]}" 2>/dev/null
    ((${#found[@]} == 0)) || fc_nap 0.2
    for p in "${found[@]}"; do
        if fc_smi_in_driver "$p"; then
            stuck+="${stuck:+, }$p"
            note+="$p ${FC_F[19]}"$'\n'
            # The shells that wait for it, which would wait as long.
            for ((q = ${above[$p]:-0}; q; q = ${above[$q]:-0})); do
                shells+=("$q")
            done
        else
            killed+="${killed:+, }$p"
        fi
    done
    ((${#shells[@]} == 0)) || kill -KILL "${shells[@]}" 2>/dev/null
    [[ -z $note ]] || fc_smi_note "$note"
    p=$FC_SMI_TIMEOUT  # 30.000 -> 30, 0.500 -> 0.5
    if [[ $p == *.* ]]; then
        while [[ $p == *0 ]]; do p=${p%0}; done
        p=${p%.}
    fi
    FC_SMI_HUNG="nvidia-smi did not answer in ${p}s (smi_timeout)"
    if [[ -n $stuck ]]; then
        FC_SMI_HUNG+=": PID $stuck outlived SIGKILL, waiting in the GPU driver (state D):"
        FC_SMI_HUNG+=" the driver is hung; see dmesg for Xid errors, then reset the GPUs"
        FC_SMI_HUNG+=" or reboot the node"
    else
        FC_SMI_HUNG+="${killed:+ and was killed (PID $killed)}: the GPU driver may be hung"
        FC_SMI_HUNG+=" (see dmesg for Xid errors) or the node overloaded"
    fi
}

# True where nvidia-smi PID waits in the GPU driver: in state D, in any of its threads (one
# may wait there while the main one is a zombie); FC_F holds its stat (fc_read_stat).
fc_smi_in_driver() {
    local t
    fc_read_stat "$1" && [[ $REPLY == nvidia-smi ]] || return 1
    local -a fields=("${FC_F[@]}")
    for t in /proc/"$1"/task/*; do
        fc_read_stat "$1/task/${t##*/}" && [[ ${FC_F[0]} == D ]] || continue
        FC_F=("${fields[@]}")
        return 0
    done
    return 1
}

# Where the nvidia-smi calls left waiting in a hung driver are noted (fc_smi_note), so that
# the host's next runs (a --watch's every refresh, a cron's status) start none: each would
# be left there too, one process more in state D a run until the node is rebooted. root's
# note is /run/fleetclean-smi-stuck, which only root can write and every login reads;
# another login's is smi-stuck in a directory of its own (fc_smi_note_dir: its lock
# directory's name in /tmp, else under XDG_RUNTIME_DIR), which no other login can write.
# A note anywhere else is never read: another user could plant one to make a healthy host
# read hung. A status script's first line (render.early_reads, its SMI_NOTES these three)
# starts its GPU read only where none of them is there (another login's: none it owns).
FC_SMI_NOTES=(/run/fleetclean-smi-stuck "/tmp/fleetclean-lock-$EUID/smi-stuck"
    "${XDG_RUNTIME_DIR:-/-}/fleetclean-lock/smi-stuck")

# Note the calls $1 names ("PID START" lines: start time, clock ticks after boot), whole
# (a rename): a run reading it meanwhile finds the last note or this one, never half.
fc_smi_note() {
    local f=${FC_SMI_NOTES[0]}
    if ((EUID != 0)); then
        fc_smi_note_dir || return 0
        f=$REPLY/smi-stuck
    fi
    { printf '%s' "$1" >"$f.$$" && mv -f -- "$f.$$" "$f"; } 2>/dev/null ||
        rm -f -- "$f.$$" 2>/dev/null
}

# Where a note names a call an earlier run left in the driver that still waits there (the
# same process, by its start time), this run starts none: every call fails at once, as
# after one that did not answer here (FC_SMI_HUNG). A note of none that is still there is
# removed by its own login (root's by root). At the start of every run (fc_begin).
fc_smi_noted() {
    local f line pid left="" who=""
    local -a notes=("${FC_SMI_NOTES[0]}") lines=()
    if ((EUID != 0)); then
        # Both of its places: its note may be in the second one, written while another
        # user held the first, which is its own now.
        ! fc_own_dir look "${FC_SMI_NOTES[1]%/*}" || notes+=("$REPLY/smi-stuck")
        ! fc_own_dir look "${FC_SMI_NOTES[2]%/*}" || notes+=("$REPLY/smi-stuck")
    fi
    for f in "${notes[@]}"; do
        [[ -f $f && ! -L $f ]] || continue
        { mapfile -n 16 -t lines <"$f"; } 2>/dev/null
        for line in "${lines[@]}"; do
            pid=${line%% *}
            [[ $pid == +([0-9]) ]] && fc_smi_in_driver "$pid" &&
                [[ ${FC_F[19]} == "${line#* }" ]] && left+="${left:+, }$pid"
        done
        [[ -z $left ]] || break
        [[ ! -O $f ]] || rm -f -- "$f" 2>/dev/null
    done
    [[ -n $left ]] || return 0
    [[ -O $f ]] || who=" as root"
    FC_SMI_HUNG="nvidia-smi not started: PID $left, left by an earlier run, waiting in the"
    FC_SMI_HUNG+=" GPU driver (state D): the driver is hung; see dmesg for Xid errors, then"
    FC_SMI_HUNG+=" reset the GPUs or reboot the node (to try nvidia-smi all the same, delete"
    FC_SMI_HUNG+=" $f$who)"
}

# REPLY = the directory where a login other than root writes its note: the first of its
# own at FC_SMI_NOTES' other two places (made where need be), where the status's first
# line and fc_smi_noted look.
fc_smi_note_dir() {
    fc_own_dir make "${FC_SMI_NOTES[1]%/*}" "${FC_SMI_NOTES[2]%/*}"
}

# REPLY = the standard output of the command $@ (its errors dropped), read in blocks
# (fc_read_fd).
fc_output() {
    local src
    exec {src}< <("$@" 2>/dev/null)
    fc_read_fd "$src"
    exec {src}<&-
}

# FC_LINES = the lines of $1, split in memory (empty ones dropped, none globbed): no
# read(2) per byte as read and mapfile make on a pipe, nor a read and a seek per line as
# on a file or a here-string's temporary file.
fc_lines() {
    local - IFS=$'\n'
    set -f
    # shellcheck disable=SC2206
    FC_LINES=($1)
}

# ---------------------------------------------------------------------------- time
# Microseconds since the epoch, from a builtin (no date(1) fork per poll).
fc_now_us() {
    REPLY=${EPOCHREALTIME//[!0-9]/}
}

# The same from the kernel's uptime (10 ms steps), where bash has no EPOCHREALTIME (before
# 5.0: RHEL 8 and its rebuilds ship 4.4). There every clock read was empty, so that no
# grace or deadline ever ended: a stubborn process was never sent SIGKILL and the script
# never finished, holding the node's lock. Uptime never steps back; the epoch is taken
# once, at the first read (to the second: what a record's absolute time needs). A read
# of /proc/uptime that fails (no descriptor left) gives the epoch's whole seconds, and no
# read goes back past the one before it.
if ((BASH_VERSINFO[0] < 5)) || [[ -z ${EPOCHREALTIME:-} ]]; then
    unset FC_CLOCK_BASE FC_CLOCK_LAST
    fc_now_us() {
        local up='' _
        { read -r up _ </proc/uptime; } 2>/dev/null
        if [[ $up =~ ^[0-9]+\.[0-9][0-9]$ ]]; then
            up=${up//./}
            if [[ -z ${FC_CLOCK_BASE:-} ]]; then
                printf -v FC_CLOCK_BASE '%(%s)T' -1
                FC_CLOCK_BASE=$((FC_CLOCK_BASE * 1000000 - 10#$up * 10000))
            fi
            REPLY=$((FC_CLOCK_BASE + 10#$up * 10000))
        else
            # A second behind: the uptime clock's base is the first read's whole second.
            printf -v REPLY '%(%s)T' -1
            REPLY=$(((REPLY - 1) * 1000000))
        fi
        ((REPLY >= ${FC_CLOCK_LAST:-0})) || REPLY=$FC_CLOCK_LAST
        FC_CLOCK_LAST=$REPLY
    }
fi

# Sleep $1 seconds without forking: read on a pipe nobody writes to times out. The pipe
# is made at the first nap (one fork), so that a run that never waits (a status) pays
# nothing for it.
fc_nap() {
    if [[ -z ${FC_NAP_FD:-} ]]; then
        { exec {FC_NAP_FD}<> <(:); } 2>/dev/null || FC_NAP_FD=none
    fi
    if [[ $FC_NAP_FD != none ]]; then
        read -r -t "$1" -u "$FC_NAP_FD" _ || :
    else
        sleep "$1"
    fi
}

# ---------------------------------------------------------------------------- process table
declare -gA FC_PPID=() FC_PGRP=() FC_SID=() FC_START=() FC_STATE=() FC_COMM=() FC_ARGV0=() FC_CMD=()
declare -ga FC_PIDS=()
# A kernel thread's bit in the flags of its stat (the seventh of FC_F), since Linux 2.6.27.
FC_PF_KTHREAD=0x200000
# A process in its exit (its memory released, or about to be: its command line may read
# empty), the same field; a thread dumping its process's core, which the other threads'
# SIGKILL ends with it.
FC_PF_EXITING=0x4 FC_PF_DUMPCORE=0x200
# SIGKILL's bit in a mask of signals: stat's field 31 (the thread's own pending signals,
# SigPnd's first 31), status's ShdPnd (the process's). A kill, even of one thread, puts it
# in every thread's own mask; each takes it out only as it begins its exit.
FC_SIGKILL=0x100
# Where a process whose main thread ended while others live on (fc_live_thread) is read:
# PID -> "PID/task/TID", a living thread's directory under /proc. Its command line,
# descriptors and environment are that thread's; the leader's read empty.
declare -gA FC_LIVE_DIR=()

# REPLY = the value of field KEY of the /proc file FILE (a process's status: Uid, ShdPnd,
# SigIgn, "ShdPnd:<TAB>0000000000000100"; a descriptor's fdinfo: flags), read in one pass
# (mapfile, its first MAX lines): read a line at a time, bash seeks back after each line,
# and the kernel makes the file anew at each read; where a line before the field changed
# length in between (a status's State: as the process woke or slept, an fdinfo's pos: as
# it wrote) the lines after it were read from the wrong place, the field never found (a
# process that wakes every 50 us: 282 misses in 3,000 reads of its Uid:). False, REPLY
# empty, where it is gone or has no such field.
fc_proc_field() {
    local line
    local -a status=()
    { mapfile -n "${4:-64}" -t status <"$1"; } 2>/dev/null
    for line in "${status[@]}"; do
        [[ $line == "$2:"* ]] || continue
        REPLY=${line#*:}
        REPLY=${REPLY#"${REPLY%%[![:space:]]*}"}
        return 0
    done
    REPLY=""
    return 1
}

# FC_UIDS = PID's real, effective, saved and file system uids ("Uid:<TAB>real<TAB>effective
# <TAB>saved<TAB>filesystem", within the file's first 12 lines); false, FC_UIDS empty, where
# it is gone or unreadable. Every reader of a process's uid comes here: who may signal it,
# whose it is, its scope.
fc_proc_uids() {
    local IFS=$' \t\n'
    FC_UIDS=()
    fc_proc_field "/proc/$1/status" Uid 12 || return 1
    # shellcheck disable=SC2206  # four numbers
    FC_UIDS=($REPLY)
}

# Read one /proc/PID/stat; sets FC_F (fields from 3 on) and REPLY (comm). Fails if gone.
fc_read_stat() {
    local stat="" rest IFS=' '
    # Whole, not its first line: comm may hold a newline (prctl(PR_SET_NAME) takes any
    # byte), and a process so named read as having no fields, no start time, and was
    # passed over by every stage. The file has no NUL, so read ends at its end (status 1).
    { read -r -d '' stat <"/proc/$1/stat"; } 2>/dev/null
    [[ -n $stat ]] || return 1
    REPLY=${stat#*\(}
    REPLY=${REPLY%\)*}
    # comm may hold spaces and parentheses: the fields start after the last ") ". Found by
    # stripping the shortest prefix until none is left (the longest-prefix pattern costs
    # quadratic time: 2x this whole function), then word splitting, not a here-string (a
    # temporary file or pipe per process scanned). The fields are numbers and one state
    # letter: nothing in them can glob.
    rest=${stat#*) }
    while [[ $rest == *") "* ]]; do rest=${rest#*) }; done
    # shellcheck disable=SC2206
    FC_F=($rest)
}

# Full command line of PID (NULs as spaces, trailing blanks dropped), a living thread's
# where its main thread has ended (FC_LIVE_DIR); empty for kernel threads, the exiting and
# the gone. setproctitle leaves its title followed by hundreds of
# NULs, i.e. hundreds of empty elements: the first of the empty tail is found by bisection
# ("every element from k on is empty" holds for every k past it), not by one unset per NUL
# (13 ms per titled process, most of a busy node's status). With COMM given and
# lib-kill.sh loaded (FC_WANT_IDENT), the process's identity is worked out from the same
# words (fc_identity): no second read.
fc_cmdline() {
    local -a argv=()
    { mapfile -d '' -t argv <"/proc/${FC_LIVE_DIR[$1]:-$1}/cmdline"; } 2>/dev/null || :
    local lo=0 hi=${#argv[@]} mid IFS= n=${#argv[@]}
    if ((hi)) && [[ -n ${argv[-1]} ]]; then
        lo=$hi  # no padding: most processes
    elif ((hi > 1)) && [[ -z "${argv[*]:1}" ]]; then
        hi=1  # a title and its padding
    fi
    while ((lo < hi)); do
        mid=$(((lo + hi) / 2))
        if [[ -z "${argv[*]:mid}" ]]; then hi=$mid; else lo=$((mid + 1)); fi
    done
    FC_ARGV0_ONE=${argv[0]:-}
    if [[ -n ${FC_WANT_IDENT:-} && -n ${2+set} ]]; then
        fc_identity "$1" "$2" "$((n > lo))"
    fi
    IFS=' '
    REPLY="${argv[*]:0:lo}"
    while [[ ${REPLY: -1} == [[:space:]] ]]; do REPLY=${REPLY%?}; done
}

# True while PID still has a command line: it is not yet in its exit, where the kernel
# has already released its address space (/proc/PID/cmdline reads empty).
fc_has_cmdline() {
    local c=""
    { IFS= read -r -d '' -n 1 c <"/proc/$1/cmdline"; } 2>/dev/null || [[ -n $c ]]
}

# The process table entries of one PID (what fc_scan fills for all): enough for
# fc_protected without a scan of every process.
fc_proc_load() {
    [[ -n ${FC_START[$1]:-} ]] && return 0
    fc_proc_fill "$1"
}

# PID's entries in the process table, read from its stat and cmdline; fails when it is
# gone. The one definition of an entry: fc_scan fills every process with it.
fc_proc_fill() {
    local pid=$1
    fc_read_stat "$pid" || return 1
    FC_NAMES_NL=""  # the table changes (verify.sh: fc_apps_trusted)
    FC_COMM[$pid]=$REPLY
    FC_STATE[$pid]=${FC_F[0]}
    FC_PPID[$pid]=${FC_F[1]}
    FC_PGRP[$pid]=${FC_F[2]}
    FC_SID[$pid]=${FC_F[3]}
    # Field 22 of stat: with the PID it names one process for its whole life.
    FC_START[$pid]=${FC_F[19]}
    unset "FC_LIVE_DIR[$pid]"
    # A kernel thread has no command line: its read and identity were two thirds of its cost.
    if ((FC_F[6] & FC_PF_KTHREAD)); then
        FC_CMD[$pid]="" FC_ARGV0[$pid]=""
        return 0
    fi
    # A zombie main thread whose process lives on in another (fc_live_thread): alive, in
    # that thread's state, named and read by it.
    if [[ ${FC_F[0]} == Z ]] && fc_live_thread "$pid"; then
        FC_STATE[$pid]=$FC_LIVE_STATE
        FC_LIVE_DIR[$pid]=$FC_LIVE_TASK
    fi
    fc_cmdline "$pid" "${FC_COMM[$pid]}"
    FC_CMD[$pid]=$REPLY
    FC_ARGV0[$pid]=$FC_ARGV0_ONE
}

# The driver's facts about each GPU, by its directory under FC_GPU_DRIVER (0000:18:00.0:
# fc_bus_dir of the bus id nvidia-smi prints): FC_GPU_INFO[dir] = "minor uuid, name", the
# minor being the N of its /dev/nvidiaN, which need not be nvidia-smi's index. The
# verification (verify.sh) and a scope of GPUs (scope.sh) read them.
FC_GPU_DRIVER=/proc/driver/nvidia/gpus
declare -gA FC_GPU_INFO=()
FC_GPU_INFO_ALL=0  # every GPU's file read (fc_gpu_info_all), not only those asked for

# REPLY: the driver's directory name for the GPU at bus id $1 as nvidia-smi prints it: its
# PCI domain in 8 hex digits (00000000:18:00.0), where the driver writes the domain with
# at least 4 (0000:18:00.0), so a domain of 0x10000 and over (VMD, some hypervisors) keeps
# its fifth digit (10000:01:00.0: cutting 4 digits off named domain 0's GPU instead).
fc_bus_dir() {
    local domain=${1%%:*}
    if [[ $domain == 0000???? ]]; then  # every GPU but a VMD's: no loop
        REPLY=${1:4}
        REPLY=${REPLY,,}
        return 0
    fi
    domain=${domain,,}
    while ((${#domain} > 4)) && [[ $domain == 0* ]]; do domain=${domain#0}; done
    REPLY=$domain:${1#*:}
    REPLY=${REPLY,,}
}

# FC_GPU_INFO of the GPU whose driver directory is $1 (0000:18:00.0); fails when the file or
# one of the three facts is missing.
fc_gpu_info_load() {
    local text="" uuid name minor
    # The whole file in one read(2): read line by line, bash reads a block and seeks
    # back to the line's end, and the driver's /proc file makes its text anew at each
    # seek (on an H200: 2.2 ms read line by line, 0.2 ms in one read). Its three lines
    # found by expansions (a loop over its 12 lines: 60 shell commands a GPU).
    { IFS= read -r -N 65536 text <"$FC_GPU_DRIVER/$1/information"; } 2>/dev/null
    text=$'\n'$text
    fc_info_line Model "$text" || return 1
    name=$REPLY
    fc_info_line "GPU UUID" "$text" || return 1
    uuid=$REPLY
    fc_info_line "Device Minor" "$text" || return 1
    minor=$REPLY
    [[ -n $uuid && -n $name && -n $minor && $minor != *[!0-9]* ]] || return 1
    FC_GPU_INFO[$1]="$minor $uuid, $name"
}

# REPLY = the value of the first line "$1:" of a driver file's text $2 (which starts with
# a newline), without the blanks around it; fails where it has no such line. Expansions,
# not =~, which compiles its regex at each test: 45 us, three a GPU.
fc_info_line() {
    local v=${2#*$'\n'"$1":}
    [[ $v != "$2" ]] || return 1
    v=${v%%$'\n'*}
    REPLY=${v%%[![:blank:]]*}
    v=${v#"$REPLY"}
    REPLY=${v##*[![:blank:]]}
    REPLY=${v%"$REPLY"}
}

# Every GPU's FC_GPU_INFO, where a device minor is looked for by UUID (verify.sh:
# fc_minor_of_uuid), once an nvidia-smi has answered; one that fails is tried again, and
# fails the -q read, when the read names its GPU.
fc_gpu_info_all() {
    local dir
    for dir in "$FC_GPU_DRIVER"/*/; do
        dir=${dir%/}
        [[ -n ${FC_GPU_INFO[${dir##*/}]:-} ]] || fc_gpu_info_load "${dir##*/}" || :
    done
    FC_GPU_INFO_ALL=1
}

# FC_APP_PID, FC_APP_MIB and FC_APP_UUID, in step and in the list's order: each process
# that lines of nvidia-smi's compute-apps CSV ($@) name, its memory (the field before the
# UUID: "" where the line has none) and the UUID of the GPU each names it on. A line is
# "pid, name, memory, uuid", or lacks the name or the memory (the name-less reads:
# verify.sh's fc_apps_trusted, scope.sh). nvidia-smi prints a name (argv[0]) as it is: one holding a
# comma and a newline cuts its line in two, neither of which reads as a line (the first
# ends in a comma, the second starts with no PID), so that its process is found by its
# device files as any process nvidia-smi does not list (an empty key would have ended the
# whole script). A name can also forge a whole line, which reads as one here: the callers
# read the list without names where that can be (verify.sh: fc_apps_trusted).
fc_apps_pairs() {
    local line mib
    FC_APP_PID=() FC_APP_MIB=() FC_APP_UUID=()
    for line in "$@"; do
        [[ $line =~ ^([0-9]+),(.*,)?\ *(GPU-[^,]+)$ ]] || continue
        mib=${BASH_REMATCH[2]%,}
        mib=${mib##*,}
        FC_APP_PID+=("${BASH_REMATCH[1]}")
        FC_APP_MIB+=("${mib//[[:space:]]/}")
        FC_APP_UUID+=("${BASH_REMATCH[3]}")
    done
}

# REPLY: the GPUs (" UUID...") nvidia-smi lists the nearest listed kin of PID on, PID
# itself unlisted: its nearest listed ancestor, else the listed processes of its process
# group (FC_KIN: the first of them); fails where none is listed. CUDA's open files pass to
# a forked child (a DataLoader's workers), and a process that only initialised CUDA holds
# every GPU's file without a context: neither is listed, and each is its job's, on its
# job's GPUs. $2: the map of PID -> " UUID..." (nvidia-smi's list); $3, where given: the
# holders (" pid pid ") of the device file that brought PID here, which a kin must be
# among (the sign that PID's file is its job's, inherited or opened beside it). Reads
# stat alone (no command line: it can hang on a process stuck in the kernel).
fc_listed_kin() {
    local -n fc_kin_map=$2
    local p q grp hops=0 kin="" gpus="" ppid
    FC_KIN=""
    fc_kin_stat "$1" || return 1
    grp=$FC_KPGRP ppid=$FC_KPPID
    p=$ppid
    while [[ -n $p && $p != 0 && $p != 1 ]] && ((hops++ < 64)); do
        if [[ -n ${fc_kin_map[$p]:-} ]]; then
            [[ -z ${3+set} || $3 == *" $p "* ]] || break
            kin=$p gpus=${fc_kin_map[$p]}
            break
        fi
        fc_kin_stat "$p" || break
        p=$FC_KPPID
    done
    if [[ -z $kin && $grp == +([0-9]) && $grp != [01] ]]; then
        for q in "${!fc_kin_map[@]}"; do
            [[ -z ${3+set} || $3 == *" $q "* ]] || continue
            fc_kin_stat "$q" && [[ $FC_KPGRP == "$grp" ]] || continue
            gpus+=${fc_kin_map[$q]}
            kin=${kin:-$q}
        done
    fi
    REPLY=$gpus FC_KIN=$kin
    [[ -n $gpus ]]
}

# FC_KPPID and FC_KPGRP of PID, from the process table where it holds PID, else its stat.
fc_kin_stat() {
    if [[ -n ${FC_START[$1]:-} ]]; then
        FC_KPPID=${FC_PPID[$1]} FC_KPGRP=${FC_PGRP[$1]}
        return 0
    fi
    fc_read_stat "$1" || return 1
    FC_KPPID=${FC_F[1]} FC_KPGRP=${FC_F[2]}
}

# User name of UID from /etc/passwd (fc_user_name_local); else from the directory service:
# on a real cluster most people are in LDAP or SSSD, not in /etc/passwd, and a culprit
# named by number is one nobody recognises. That asks NSS (getent under timeout: two
# processes per UID /etc/passwd lacks, once a run), within 2 s; a directory that did not
# answer is not asked again in the run, so it costs a status 2 s in all, not its own
# timeout (sssd's, nslcd's: 10 s and more) per user. The number when neither knows it.
declare -gA FC_PASSWD=()
FC_NSS_DOWN=0
fc_user_name() {
    local uid=${1:--} name line=""
    fc_user_name_local "$uid"
    if [[ -z $REPLY && $uid == +([0-9]) ]] && ((!FC_NSS_DOWN)); then
        fc_flush  # nothing held while a command may block (fc_hold)
        line=$(timeout 2 getent passwd -- "$uid" </dev/null 2>/dev/null) ||
            { (($? == 124)) && FC_NSS_DOWN=1; line=""; }
        name=${line%%:*}
        [[ $line == *:* && -n $name ]] || name=$uid
        FC_PASSWD[$uid]=$name
    fi
    REPLY=${FC_PASSWD[$uid]:-$uid}
}

# UID's name in /etc/passwd (the first line with that UID, as getpwuid gives it), or ""
# (REPLY); never the directory service, so it cannot block (fc_verify_prep asks it while a
# GPU read runs). The file is read once, in one builtin, and searched for each of the
# first few UIDs asked: a loop over its lines costs 10 us a line (0.3 ms for 30 accounts,
# 22 ms for 3,000, after a busy status's GPU read), a search ~16 ns a byte. From the
# fourth UID on, its lines are read into the table once, so that a node with many users'
# processes pays no more than that loop.
FC_PASSWD_TEXT="" FC_PASSWD_FILE=/etc/passwd FC_PASSWD_ASKED=0
declare -gA FC_PASSWD_MISSED=()  # UIDs searched for and not found (a directory's users)
fc_user_name_local() {
    local uid=$1 text="" re name _
    if [[ -n ${FC_PASSWD[$uid]+set} ]]; then
        REPLY=${FC_PASSWD[$uid]}
        return 0
    fi
    REPLY=""
    [[ $uid == +([0-9]) && -z ${FC_PASSWD_MISSED[$uid]:-} ]] && ((FC_PASSWD_ASKED >= 0)) ||
        return 0
    if ((++FC_PASSWD_ASKED > 3)); then
        FC_PASSWD_ASKED=-1  # the table holds every line now: a UID not in it is not there
        # Only lines with a UID: NIS's "+::::::" (compat mode) has none, and an empty key
        # is a fatal error in a script (the loop before this one ended every busy status
        # there).
        while IFS=: read -r name _ text _ || [[ -n $name ]]; do  # a last line without \n
            [[ -n $name && $text == +([0-9]) && -z ${FC_PASSWD[$text]+set} ]] &&
                FC_PASSWD[$text]=$name
        done 2>/dev/null <"$FC_PASSWD_FILE"
        REPLY=${FC_PASSWD[$uid]:-}
        return 0
    fi
    if [[ -z $FC_PASSWD_TEXT ]]; then
        IFS= read -r -d '' text 2>/dev/null <"$FC_PASSWD_FILE"
        FC_PASSWD_TEXT=$'\n'$text
    fi
    # The first line of the UID with a name, as the table below takes it.
    re=$'\n''([^:'$'\n'']+):[^:'$'\n'']*:'$uid':'
    if ! [[ $FC_PASSWD_TEXT =~ $re ]]; then
        FC_PASSWD_MISSED[$uid]=1
        return 0
    fi
    REPLY=${BASH_REMATCH[1]}
    FC_PASSWD[$uid]=$REPLY
}

# Is the process that was (pid, starttime, command line) still alive? Gone: no such
# process, another one under its PID (starttime), a zombie (<defunct>: only its parent's
# wait() removes it), or a process in its exit: its address space is released (its
# command line, which it had, reads empty) and what is left is the kernel closing its
# files. Waiting for those is the verification's job (it reads the GPUs), not a reason to
# say it survived SIGKILL: under load that took 19 of 256 hosts to "error". (A killed
# zombie whose other threads live on still holds its files: fc_exit_waits. One whose main
# thread alone ended, its others not killed, is alive: fc_live_thread, its command line
# its living thread's.)
fc_alive() {
    local dir=$1
    fc_read_stat "$1" && [[ ${FC_F[19]} == "$2" ]] || return 1
    if [[ ${FC_F[0]} == [ZX] ]]; then
        # Its main thread ended, another lives on, not killed: alive (fc_live_thread).
        [[ ${FC_F[0]} == Z ]] && fc_live_thread "$1" || return 1
        dir=$FC_LIVE_TASK
    fi
    [[ -z ${3:-} ]] || fc_has_cmdline "$dir"
}

# True when the process PID, whose main thread is a zombie (its stat in FC_F: state Z),
# lives on in another thread: its main thread called pthread_exit (ps reads "Zl": no
# command line, an empty /proc/PID/fd) while the others work on, holding its files, its
# GPU's memory, and nvidia-smi listing the PID. Such a process is alive. A killed one
# looks the same from its leader (item 58: a thread waiting in the driver outlives the
# kill), and differs in its threads: each is in its exit (PF_EXITING, or dumping the core)
# or has SIGKILL pending (its own, stat's field 31; the process's, status's ShdPnd, read
# once a thread looked alive). Read from stat and status files alone, which never wait on
# a stuck process. Sets FC_LIVE_TASK ("PID/task/TID", the first living thread's) and
# FC_LIVE_STATE (its state); FC_F is left holding some thread's stat.
fc_live_thread() {
    local t
    ((FC_F[17] > 1)) || return 1
    for t in "/proc/$1/task/"*; do
        t=${t##*/}
        [[ $t != "$1" ]] || continue
        fc_read_stat "$1/task/$t" && [[ ${FC_F[0]} != [ZX] ]] || continue
        ((!(FC_F[6] & (FC_PF_EXITING | FC_PF_DUMPCORE) || FC_F[28] & FC_SIGKILL))) || continue
        fc_proc_field "/proc/$1/status" ShdPnd && [[ $REPLY == +([0-9a-fA-F]) ]] &&
            ((16#$REPLY & FC_SIGKILL)) && return 1
        FC_LIVE_TASK=$1/task/$t FC_LIVE_STATE=${FC_F[0]}
        return 0
    done
    return 1
}

# True when the process (pid, starttime; any start where empty) is in its exit and a
# thread of it waits in the kernel (state D): its main thread a zombie while another thread
# lives on (ps reads "Zl"; a CUDA process makes its driver calls from several threads), or
# the whole process in its exit (FC_PF_EXITING); not one whose main thread alone ended and
# whose others live, not killed (fc_live_thread). Its device files close, and the driver
# frees its GPU's memory, only when the last thread ends, and nvidia-smi goes on listing
# the PID. Sets FC_EXIT_START (its start time) and FC_EXIT_RUN ("TID:NS " for each thread
# in D: the CPU time it has had, the first field of its schedstat where the kernel keeps
# one): a thread that runs between two reads is making its way out, however slowly. Read
# from stat files alone: a command line's read can hang on a stuck process's memory map.
fc_exit_waits() {
    local t run waits=1
    fc_read_stat "$1" && [[ -z $2 || ${FC_F[19]} == "$2" ]] || return 1
    FC_EXIT_START=${FC_F[19]} FC_EXIT_RUN=""
    case ${FC_F[0]} in
        Z) ((FC_F[17] > 1)) || return 1 ;;
        D) ((FC_F[6] & FC_PF_EXITING)) || return 1 ;;
        *) return 1 ;;
    esac
    ! fc_live_thread "$1" || return 1
    for t in "/proc/$1/task/"*; do
        fc_read_stat "$1/task/${t##*/}" && [[ ${FC_F[0]} == D ]] || continue
        waits=0 run=""
        { read -r run _ <"$t/schedstat"; } 2>/dev/null
        FC_EXIT_RUN+="${t##*/}:$run "
    done
    return "$waits"
}

# True while a process taken for stuck (FC_STUCK: its start time) still is: alive (it
# survived SIGKILL in state D: fc_survivors) or in an exit that waits in the kernel
# (fc_exit_waits: the verification's fc_verify_all_exiting and fc_verify_mark_stuck).
fc_still_stuck() {
    [[ -n ${FC_STUCK[$1]:-} ]] || return 1
    fc_alive "$1" "${FC_STUCK[$1]}" || fc_exit_waits "$1" "${FC_STUCK[$1]}"
}

# ---------------------------------------------------------------------------- self-exclusion
declare -gA FC_ANCESTOR=() FC_PROTECTED_NAME=()
FC_SELF_SID=0

# The script, its ancestors up to PID 1 (so the sshd serving it) and its session; the
# protected names as a set (keys get a "_" so that an empty name is never one). A teardown
# reads them as it begins; a read-only run (status, --check), which signals nothing, when
# first asked (fc_self: a status on an idle host never is, and saves a read of /proc per
# ancestor). A subshell that asks first reads them anew: its ancestors are the script and
# the script's ancestors.
FC_SELF_DONE=0
fc_self() {
    ((FC_SELF_DONE)) || fc_self_init
}

fc_self_init() {
    local pid=$BASHPID name
    ((BASH_SUBSHELL)) || FC_SELF_DONE=1
    FC_PROTECTED_NAME=()
    for name in "${FC_PROTECT[@]}"; do
        FC_PROTECTED_NAME[${name}_]=1
        # The kernel keeps a process's name (comm) to 15 bytes: a longer name never
        # matched it whole (jupyter-notebook is "jupyter-noteboo").
        FC_PROTECTED_NAME[${name:0:15}_]=1
    done
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
    fc_self
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
        if [[ -n ${FC_PROTECTED_NAME[${FC_COMM[$pid]:-}_]:-} || -n ${FC_PROTECTED_NAME[${base}_]:-} ]]
        then
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

# ---------------------------------------------------------------------------- rights
# A login without root may signal only its own processes. A kill that fails while its
# target lives on is that (EPERM): fc_deny (lib-kill.sh) lists the target with its user in
# FC_DENIED, fc_stage makes the stage "denied" (which leaves the host dirty), and it is no
# longer waited for: its grace period could not change anything (lib-stage.sh).
declare -ga FC_DENIED=()
FC_DENIED_ANY=0

# ---------------------------------------------------------------------------- open files
# "PID FD TARGET" for every open descriptor whose target starts with $1, from one
# `ls -l` over /proc/*/fd (bash has no readlink builtin; one fork, not one per fd). The
# listing is in ls's escape quoting (fc_ls), so that every descriptor is one line: a name
# holding a newline and "/proc/N/fd:" would otherwise make the descriptors listed after it
# look like process N's, and one holding " -> /dev/nvidia0" like a GPU's. TARGET is
# printed as ls escapes it. A process the table knows whose main thread has ended (its
# /proc/PID/fd empty) is listed by its living thread's (FC_LIVE_DIR), as PID.
fc_ls() {
    # Dates as numbers: a caller's TIME_STYLE could write " -> /dev/nvidia0" in each line.
    LC_ALL=C QUOTING_STYLE=escape TIME_STYLE=+%s ls -l "$@"
}
fc_open_fds() {
    local prefix line pid="" left fd target d
    local -a live=()
    for d in "${FC_LIVE_DIR[@]}"; do live+=("/proc/$d/fd"); done
    fc_ls_escape "$1"
    prefix=$REPLY REPLY=""
    # ls's output is read in blocks and split in memory: read(2) a byte at a time, as bash
    # reads a pipe, cost 0.3-0.9 s for 20,000 descriptors, which a node running services
    # and a server's workers can hold; a simulated node holds a few hundred. grep, where
    # there is one, passes on only the directories' lines and the wanted targets'; where
    # it passed on no directory at all (it failed), the listing is read whole.
    if command -v grep >/dev/null 2>&1; then
        fc_output fc_ls_narrowed "$prefix" "${live[@]}"
    fi
    [[ $REPLY == *"/fd:"* ]] || fc_output fc_ls /proc/[0-9]*/fd "${live[@]}"
    fc_lines "$REPLY"
    for line in "${FC_LINES[@]}"; do
        case $line in
            /proc/*/fd:)
                pid=${line#/proc/}
                pid=${pid%%/*}
                ;;
            # Only the lines of wanted targets are split: a node has thousands of fds.
            l*" -> $prefix"*)
                left=${line%% -> *}
                fd=${left##* }
                target=${line#* -> }
                [[ $target == "$prefix"* ]] && printf '%s %s %s\n' "$pid" "$fd" "$target"
                ;;
        esac
    done
}

# fc_ls of every process's descriptors (and of the directories after $1), only the
# directories' lines and those whose target starts with $1 (escaped): grep's C locale,
# whatever GREP_OPTIONS a login sets.
fc_ls_narrowed() {
    fc_ls /proc/[0-9]*/fd "${@:2}" | LC_ALL=C GREP_OPTIONS='' grep -F -e /fd: -e " -> $1"
}

# $1 as GNU ls writes a name in escape quoting in the C locale (REPLY): a backslash and a
# space escaped, \a \b \t \n \v \f \r as such, every other byte that is not printable ASCII
# in octal (\303\251 for an é).
fc_ls_escape() {
    local LC_ALL=C s=$1 c i
    if [[ $s != *[!A-Za-z0-9/._+:,@%=-]* ]]; then
        REPLY=$s  # most paths: nothing to escape
        return 0
    fi
    REPLY=""
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
            \\) REPLY+="\\\\" ;;
            ' ') REPLY+='\ ' ;;
            [[:print:]]) REPLY+=$c ;;
            $'\a') REPLY+='\a' ;;
            $'\b') REPLY+='\b' ;;
            $'\t') REPLY+='\t' ;;
            $'\n') REPLY+='\n' ;;
            $'\v') REPLY+='\v' ;;
            $'\f') REPLY+='\f' ;;
            $'\r') REPLY+='\r' ;;
            *)
                # The byte's value (masked: musl's bash gives a high byte's as a wide one).
                printf -v c '%d' "'$c"
                printf -v c '\\%03o' "$((c & 255))"
                REPLY+=$c
                ;;
        esac
    done
}

# Who has the GPU device files open, from one fc_open_fds: FC_GF[index] (" pid pid":
# holders of /dev/nvidiaN) and FC_GF_CUDA[pid] (1: it has /dev/nvidia-uvm open too, as
# every CUDA process does; NVML users (nvidia-smi, a monitoring agent, nvidia-persistenced)
# hold device files but no GPU memory and do not).
fc_gpu_files() {
    local pid target idx
    declare -gA FC_GF=() FC_GF_CUDA=()
    while read -r pid _ target; do
        case $target in
            /dev/nvidia-uvm) FC_GF_CUDA[$pid]=1 ;;
            /dev/nvidia[0-9]*)
                idx=${target#/dev/nvidia}
                [[ $idx =~ ^[0-9]+$ ]] || continue
                [[ " ${FC_GF[$idx]:-} " == *" $pid "* ]] || FC_GF[$idx]+=" $pid"
                ;;
        esac
    done < <(fc_open_fds /dev/nvidia)
}

# ---------------------------------------------------------------------------- stage driver
FC_HALT=0
FC_IDX=0
FC_LAST_SIGNAL_US=0
FC_RESPAWN_RISK=0
declare -A FC_WATCH=() FC_BEFORE=() FC_STUCK=()
declare -A FC_CLAIMED=()

# Drop the previous stage's options so a stage never sees another's values.
fc_reset_opts() {
    local v
    for v in "${!opt_@}"; do
        unset "$v"
    done
}

# REPLY = the first DIR that is a directory only this user can write to, made (mode 0700)
# where MODE is "make": /run/lock and /tmp are world-writable, where another user could
# hold a file of ours or plant a symlink there.
fc_own_dir() {
    local mode=$1 d
    shift
    for d in "$@"; do
        [[ -n $d ]] || continue
        [[ $mode != make ]] || mkdir -m 0700 "$d" 2>/dev/null
        if [[ -d $d && ! -L $d && -O $d ]]; then
            REPLY=$d
            return 0
        fi
    done
    return 1
}

# The lock's directory, and the journal's (MODE: make, the default, or look). Under
# XDG_RUNTIME_DIR only where another user holds the name in /tmp: logind removes that
# directory when the login's last session ends, as a teardown that lost its controller
# ends its own, journal and lock with it.
fc_lock_dir() {
    fc_own_dir "${1:-make}" /run/fleetclean-lock "/tmp/fleetclean-lock-$EUID" \
        "${XDG_RUNTIME_DIR:+$XDG_RUNTIME_DIR/fleetclean-lock}"
}

# ---------------------------------------------------------------------------- the journal
# A teardown whose controller goes away (fleetclean is killed, a second Ctrl-C closes the
# connection, the connection breaks) used to die at its next write (SIGPIPE): a node left
# with its server stopped, its workers holding GPUs, its patched file in place, and no
# word of it anywhere. A teardown that holds the lock now keeps its records in a journal as
# well; when a write finds the controller gone (SIGPIPE, or SIGHUP where sshd gave a
# terminal), it notes the time, sends the rest nowhere but the journal, and finishes its
# work. The next run on the host by the same login (status or teardown) sends that journal
# as a "journal" record, which the controller reports (results/journal.py). A journal whose
# run kept its controller to the end, as far as the node can tell, is kept at its exit as
# "heard.TOKEN" beside it: a connection that stalls without an error (a network that drops
# silently while sshd still takes the output, a controller stopped and then killed) looks
# kept to the end from here, and only the controller knows it never had the end. So a
# run's journaled line carries its run's token (FC_RUN), which the controller keeps for
# each host it did not hear to the end (results/unheard.py); the host's next runs from it
# ask for those tokens (FC_UNHEARD), and each such journal is told until the controller has
# the node's answer for its token (fc_journal_asked).
# Without a token (an exported bundle: no controller to ask) it is emptied. An exported
# bundle keeps a journal too, and a status bundle sends one (FC_TAP_JOURNAL,
# standalone.sh): the tool that runs it (clush, pdsh, ssh) can go away as fleetclean can.
# The epilog, whose output slurmd does not read, keeps none and sends none.
FC_JOURNAL="" FC_JOURNAL_FD="" FC_GONE=0 FC_BEGIN_REC="" FC_TAP_JOURNAL=0 FC_RUN="" FC_UNHEARD=""

# Record lines $1 out now: to the controller while it is there, then, where a teardown
# keeps a journal, into it (after the "gone" line where this write found the controller
# gone: the first record it never had); a full disk is no reason to say so at every write.
fc_write() {
    if [[ -z $FC_JOURNAL_FD ]]; then
        printf '%s' "$1"
        return
    fi
    ((FC_GONE)) || printf '%s' "$1" || fc_gone
    printf '%s' "$1" 2>/dev/null 1>&"$FC_JOURNAL_FD"
}

# The controller is gone: the rest of the run writes nowhere but the journal.
fc_gone() {
    local t
    ((FC_GONE)) && return 0
    FC_GONE=1
    exec >/dev/null 2>&1
    printf -v t '%(%s)T' -1
    [[ -z $FC_JOURNAL_FD ]] || printf '@@fleetclean\tgone\t%s\n' "$t" >&"$FC_JOURNAL_FD"
}

# The traps a teardown stands on (gpu-reset.sh sets its own for a while, then these again).
fc_traps() {
    trap - INT TERM
    if [[ -n $FC_JOURNAL_FD ]]; then
        trap fc_gone PIPE HUP
        trap fc_journal_end EXIT
    else
        trap - EXIT HUP PIPE
    fi
}

# Start the journal (the lock held): what an earlier run that lost its controller left is
# sent first, and the heard journals the controller asks for (fc_journal_asked); then the
# journal begins anew with this run's begin record.
fc_journal_begin() {
    local t dir=${FC_LOCK_PATH%/*}
    fc_journal_send "$dir" 1
    [[ -z $FC_UNHEARD ]] || fc_journal_asked "$dir" 1
    # Appended to (after emptying it): a status that empties it meanwhile leaves no hole.
    if ! { : >"$dir/journal" && exec {FC_JOURNAL_FD}>>"$dir/journal"; }; then
        FC_JOURNAL_FD=""
        return 0
    fi
    FC_JOURNAL=$dir/journal
    printf -v t '%(%s)T' -1
    printf '@@fleetclean\tjournaled\t%s\t%s\n%s' "$t" "$FC_RUN" "$FC_BEGIN_REC" \
        >&"$FC_JOURNAL_FD"
    fc_traps
}

# At the script's exit: a run that kept its controller to the end, as far as it can tell,
# is kept as "heard.TOKEN" (a rename: a status looks at "journal" alone unless it is
# asked), for its controller to ask for where it did not hear that end; without a token,
# or where the rename fails, it leaves nothing to tell. A broken pipe or a hangup from here
# on changes nothing: whatever the controller missed of the end, the token covers.
fc_journal_end() {
    [[ -n $FC_JOURNAL_FD ]] || return 0
    trap '' PIPE HUP
    ((FC_GONE)) && return 0
    local dir=${FC_JOURNAL%/*}
    if [[ -n $FC_RUN ]] && mv -f -- "$FC_JOURNAL" "$dir/heard.$FC_RUN" 2>/dev/null; then
        fc_journal_prune "$dir"
        return 0
    fi
    : >"$FC_JOURNAL"
}

# Keep the 64 newest heard journals in DIR (most of them heard, never asked for: several
# controllers' teardowns may come between a stalled one and its controller's next run);
# one rm for all, none while there are 64 or fewer. At most a few MB in /run.
fc_journal_prune() {
    local i old
    local -a heard=("$1"/heard.*) drop=()
    while ((${#heard[@]} > 64)); do
        old=0
        for i in "${!heard[@]}"; do
            [[ ${heard[i]} -ot ${heard[old]} ]] && old=$i
        done
        drop+=("${heard[old]}")
        unset 'heard[old]'
        heard=("${heard[@]}")
    done
    ((${#drop[@]} == 0)) || rm -f -- "${drop[@]}" 2>/dev/null
}

# Send the journal in DIR as a "journal" record where its run lost its controller, with
# "running" where that run still holds the lock. A teardown (TAKE=1: it holds the lock, so
# that run is over) then takes the journal; a read-only run takes it only where it gets
# the lock for a moment (no teardown is at work, none can start meanwhile): told once.
fc_journal_send() {
    local dir=$1 text="" fd=""
    { IFS= read -r -d '' text <"$dir/journal"; } 2>/dev/null
    [[ $text == *$'\n@@fleetclean\tgone\t'* ]] || return 0
    if ! ((${2:-0})); then
        if ! command -v flock >/dev/null 2>&1 || ! exec {fd}>>"$dir/lock"; then
            fc_rec journal "$text" ""  # no lock to ask: told now, and told again
            return 0
        fi
        if ! flock -n "$fd"; then
            # Still at work, or over and the lock another's for a moment (that run tells it).
            [[ $text == *$'\n@@fleetclean\tdone\t'* ]] || fc_rec journal "$text" running
            exec {fd}>&-
            return 0
        fi
        { IFS= read -r -d '' text <"$dir/journal"; } 2>/dev/null  # as it is now, locked
    fi
    if [[ $text == *$'\n@@fleetclean\tgone\t'* ]]; then
        fc_rec journal "$text" ""
        fc_flush  # out before it is emptied: a run cut off here leaves it to the next
        : >"$dir/journal"
    fi
    [[ -z $fd ]] || exec {fd}>&-
}

# The heard journals the controller asks for (FC_UNHEARD: the tokens of its teardowns here
# whose end it did not hear, DIR: their directory, "" where there is none), each told, and
# an "unheard" record for each token dealt with: told now, or nothing kept under it
# (pruned, never begun here), but for the run of that token still at work here (its journal
# not renamed yet: a read-only run leaves it to a later one; a teardown tells what it left,
# over without its exit). A heard journal is not emptied once told: the controller forgets
# the token once it has the answer, and asks again where it did not get it (this run's own
# connection stalled too). The journal is looked at before its heard name: a run that
# renames it in between is found there, never taken for one with nothing kept.
fc_journal_asked() {
    local dir=$1 tok line text
    for tok in $FC_UNHEARD; do
        line="" text=""
        [[ -z $dir ]] || { IFS= read -r line <"$dir/journal"; } 2>/dev/null
        if [[ $line == *$'\t'"$tok" ]]; then
            ((${2:-0})) || continue
            { IFS= read -r -d '' text <"$dir/journal"; } 2>/dev/null
        elif [[ -n $dir && -s $dir/heard.$tok ]]; then
            { IFS= read -r -d '' text <"$dir/heard.$tok"; } 2>/dev/null
        fi
        [[ -z $text ]] || fc_rec journal "$text" ""
        fc_rec unheard "$tok"
    done
}

# A read-only run (status) looks for a journal without making the directory (no process).
fc_journal_look() {
    if ! fc_lock_dir look; then
        [[ -z $FC_UNHEARD ]] || fc_journal_asked "" 0  # none here: nothing kept
        return 0
    fi
    local dir=$REPLY
    [[ ! -s $dir/journal ]] || fc_journal_send "$dir" 0
    [[ -z $FC_UNHEARD ]] || fc_journal_asked "$dir" 0
}

# Take the per-host lock: FC_LOCK_STATE ok, none (no private directory, no flock: run
# unlocked), or busy (another run holds it past lock_wait seconds: fails).
fc_lock() {
    FC_LOCK_STATE=none
    fc_lock_dir || return 0
    FC_LOCK_PATH=$REPLY/lock
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>>"$FC_LOCK_PATH" || return 0
    FC_LOCK_STATE=busy
    flock -w "$FC_LOCK_WAIT" 9 || return 1
    FC_LOCK_STATE=ok
}

# A read-only run's records are held from here to its first stage's record: fc_main only
# sets variables in between. A teardown's "begin" goes out before the lock is taken, which
# may wait lock_wait seconds (and its directory be made on a slow file system).
fc_begin() {
    fc_hold
    # An earlier run's nvidia-smi may wait in a hung driver (fc_smi_noted): root reads
    # only its own note, which no other login can plant.
    if [[ -e ${FC_SMI_NOTES[0]} || $EUID -gt 0 && (-O ${FC_SMI_NOTES[1]%/*} &&
        -O ${FC_SMI_NOTES[1]} || -O ${FC_SMI_NOTES[2]%/*} && -O ${FC_SMI_NOTES[2]}) ]]; then
        fc_smi_noted
    fi
    fc_rec begin 1 "$FC_PLAYBOOK" "$FC_HOST" "$FC_CHECK"
    FC_BEGIN_REC=$FC_HELD
    ((FC_CHECK)) || fc_self_init
    # A read-only run (status, --check) changes nothing, so it races with nobody: it must
    # not wait behind a teardown that holds the lock.
    if ((FC_CHECK)); then
        fc_rec lock none ""
        ((FC_TAP && !FC_TAP_JOURNAL)) || fc_journal_look
        return 0
    fi
    fc_release
    fc_lock
    local taken=$?
    # Held again once the lock is taken, to the first stage's record.
    fc_hold
    fc_rec lock "$FC_LOCK_STATE" "${FC_LOCK_PATH:-}"
    if [[ $FC_LOCK_STATE == ok ]] && ((!FC_TAP || FC_TAP_JOURNAL)); then
        # Written now, with the default SIGPIPE: a controller that left while the lock was
        # awaited ends the run here, before it acts, not a whole teardown done alone.
        fc_release
        fc_journal_begin
        fc_hold
    fi
    return "$taken"
}

fc_finish() {
    local p
    # What is held (the verdict) goes out before /proc is read again: a command line's read
    # waits for its process's memory map, which one stuck in the kernel may hold for ever.
    if ((${#FC_WATCH[@]} || ${#FC_STUCK[@]})); then
        fc_release
    fi
    # Only a stage that signals watches anything (lib-stage.sh reports what lives on).
    ((${#FC_WATCH[@]} == 0)) || fc_report_left
    # A process stuck in the kernel may let go later (the driver answers): say so.
    for p in "${!FC_STUCK[@]}"; do
        fc_still_stuck "$p" || fc_rec unstuck "$p"
    done
    fc_hold
    fc_rec "done" 0
    fc_release
}
