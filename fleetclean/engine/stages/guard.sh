# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "guard": refuse the whole teardown on this host, touching nothing, while a file
# under opt_path is open for writing, or until opt_wait_for_file has a line matching
# the ERE opt_wait_for_line. Waits up to opt_timeout_ms for both; FC_FORCE overrides.

# Writers of files under $1, as "pid N (cmdline)" words in REPLY.
fc_writers() {
    local path line pid fd target flags real
    local -a found=()
    # The kernel names an open file by its real path: one written through a symlink never
    # matched, and the guard let the teardown through.
    real=$(realpath -m -- "$1" 2>/dev/null) || real=${1%/}
    # fc_open_fds prints targets as ls escapes them: so is the path they are compared to.
    fc_ls_escape "$real"
    path=$REPLY
    fc_self  # the script's own writers (its ancestors) are not in the way
    # A process whose main thread called pthread_exit (its leader a zombie, "Zl") writes on
    # in its other threads: its leader's fd and fdinfo read empty, and such a writer was
    # never seen. Read by its living thread (fc_live_thread), as a scan reads it; found
    # anew at each look, in a table of the guard's own (a scan's is left as it was).
    local -A FC_LIVE_DIR=()
    fc_guard_live
    # Split by hand, not by read: it would drop the space of a name ending in "\ ".
    while IFS= read -r line; do
        pid=${line%% *} line=${line#* }
        fd=${line%% *} target=${line#* }
        [[ $target == "$path" || $target == "$path"/* ]] || continue
        # (Gone: no writer.)
        fc_proc_field "/proc/${FC_LIVE_DIR[$pid]:-$pid}/fdinfo/$fd" flags 4 || continue
        flags=$REPLY
        # O_WRONLY is 01 and O_RDWR 02 in the octal flags field.
        [[ $flags == +([0-7]) ]] || continue
        (((8#$flags & 3) != 0)) || continue
        [[ -n ${FC_ANCESTOR[$pid]:-} ]] && continue
        fc_cmdline "$pid"
        fc_in_list "pid $pid ($REPLY)" "${found[@]}" || found+=("pid $pid ($REPLY)")
    done < <(fc_open_fds "$real")
    local IFS=','
    REPLY=${found[*]}
    REPLY=${REPLY//,/, }
}

# FC_LIVE_DIR[PID] for each process whose main thread has ended while another thread lives
# on, not killed (fc_live_thread): its leader is a zombie with more than one thread. Read
# from stat files alone. grep, where there is one, counts ") Z " in each (one line per
# stat it read: none at all, it failed, and every stat is read here); a name holding
# ") Z " is read and let go.
fc_guard_live() {
    local line pid read=0
    local -a stats=()
    if command -v grep >/dev/null 2>&1; then
        fc_output env LC_ALL=C GREP_OPTIONS='' grep -c -F ') Z ' /proc/[0-9]*/stat
        fc_lines "$REPLY"
        for line in "${FC_LINES[@]}"; do
            [[ $line == /proc/*/stat:+([0-9]) ]] || continue
            read=1
            [[ $line == *:0 ]] || stats+=("${line%:*}")
        done
    fi
    ((read)) || stats=(/proc/[0-9]*/stat)
    for line in "${stats[@]}"; do
        pid=${line#/proc/} pid=${pid%/stat}
        [[ $pid == +([0-9]) ]] || continue
        fc_read_stat "$pid" && [[ ${FC_F[0]} == Z ]] || continue
        fc_live_thread "$pid" && FC_LIVE_DIR[$pid]=$FC_LIVE_TASK
    done
    return 0
}

# Does $1 contain a line matching ERE $2? Pure bash: grep is not promised on nodes.
fc_has_line() {
    local line
    [[ -r $1 ]] || return 1
    while IFS= read -r line || [[ -n $line ]]; do
        [[ $line =~ $2 ]] && return 0
    done <"$1"
    return 1
}

fc_stage_guard() {
    local path=$opt_path file=$opt_wait_for_file line=$opt_wait_for_line t0 why
    if [[ -z $path && -z $file ]]; then
        FC_MESSAGE="no guard configured"
        return 0
    fi
    fc_now_us
    t0=$REPLY
    while :; do
        why=""
        if [[ -n $path ]]; then
            fc_writers "$path"
            [[ -n $REPLY ]] && why="$path has writers: $REPLY"
        fi
        if [[ -z $why && -n $file ]] && ! fc_has_line "$file" "$line"; then
            why="no line matching '$line' in $file"
        fi
        [[ -z $why ]] && break
        fc_now_us
        if (((REPLY - t0) / 1000 >= opt_timeout_ms)); then
            break
        fi
        fc_nap 0.2
    done
    if [[ -z $why ]]; then
        FC_MESSAGE="guard passed"
    elif ((FC_FORCE)); then
        FC_MESSAGE="forced past guard: $why"
    else
        FC_STATUS=refused
        FC_MESSAGE="refused: $why"
        FC_HALT=1
        FC_HALT_REASON="guard '$FC_STAGE_NAME' refused"
        fc_rec error "$FC_MESSAGE"
    fi
}
