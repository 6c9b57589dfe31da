#!/usr/bin/env bash
# fleetclean 0.1.0: playbook post-extraction (built-in)
# host: "node01"  mode: run
# Runs as `bash -s` with this text on standard input. Records go to stdout as
# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.
# variables:
#   backup_suffix = ".bak_hsdump"
#   dump_dir = "/dev/shm/sglang_hs"
#   force = false
#   grace = 10
#   guard_path = ""
#   lock_wait = 5
#   max_used_mib = 0
#   model_file = ""
#   protect = []
#   server_pattern = "sglang.launch_server"
#   verify_timeout = 30
#   worker_pattern = "sglang"

# [lib.sh: the stage library, pinned by tests/data/golden/lib.sh.sha256]

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "guard": refuse the whole teardown on this host, touching nothing, while a file
# under opt_path is open for writing, or until opt_wait_for_file has a line matching
# the ERE opt_wait_for_line. Waits up to opt_timeout_ms for both; FC_FORCE overrides.

# Writers of files under $1, as "pid N (cmdline)" words in REPLY.
fc_writers() {
    local path=${1%/} pid fd target k v flags
    local -a found=()
    while read -r pid fd target; do
        [[ $target == "$path" || $target == "$path"/* ]] || continue
        flags=""
        while read -r k v; do
            [[ $k == flags: ]] && flags=$v
        done <"/proc/$pid/fdinfo/$fd" 2>/dev/null
        # O_WRONLY is 01 and O_RDWR 02 in the octal flags field.
        [[ -n $flags ]] || continue
        (((8#$flags & 3) != 0)) || continue
        [[ -n ${FC_ANCESTOR[$pid]:-} ]] && continue
        fc_cmdline "$pid"
        fc_in_list "pid $pid ($REPLY)" "${found[@]}" || found+=("pid $pid ($REPLY)")
    done < <(fc_open_fds "$path")
    local IFS=','
    REPLY=${found[*]}
    REPLY=${REPLY//,/, }
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
    fc_act_on_targets "$opt_signal" "$opt_grace_ms" "$opt_kill_wait_ms"
    FC_MESSAGE="$FC_NVSMI_NOTE$FC_MESSAGE"
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "restore": put opt_file back from opt_file$opt_backup_suffix. The backup is
# copied to a temporary file in the same directory, then renamed over the file, so a
# half-copied file never replaces the original.
fc_stage_restore() {
    local file=$opt_file backup=$opt_file$opt_backup_suffix dir tmp
    if [[ -z $file ]]; then
        FC_STATUS=ok
        FC_MESSAGE="no file to restore (file is empty)"
        return 0
    fi
    if [[ ! -f $backup ]]; then
        FC_STATUS=failed
        FC_MESSAGE="backup missing: $backup (cannot restore $file)"
        return 0
    fi
    FC_MATCHED=1
    if ((FC_CHECK)); then
        FC_STATUS=changed
        FC_MESSAGE="would restore $file from $backup"
        fc_rec change "$FC_IDX" "$FC_MESSAGE"
        return 0
    fi
    dir=$(dirname -- "$file")
    if ! tmp=$(mktemp -- "$dir/.fleetclean-restore.XXXXXX" 2>&1); then
        FC_STATUS=failed
        FC_MESSAGE="cannot create a temporary file in $dir: $tmp"
        return 0
    fi
    if ! out=$(cp --preserve=mode,ownership,timestamps -- "$backup" "$tmp" 2>&1 &&
        mv -f -- "$tmp" "$file" 2>&1); then
        rm -f -- "$tmp"
        FC_STATUS=failed
        FC_MESSAGE="restore of $file from $backup failed: $out"
        return 0
    fi
    FC_STATUS=ok
    FC_MESSAGE="restored $file from $backup"
    fc_rec change "$FC_IDX" "$FC_MESSAGE"
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "remove": delete each path of opt_paths; opt_globs[i]=1 marks a glob written in
# the playbook (a variable's value is never globbed). Refuses empty paths and
# anything that resolves to / or a top-level directory (/, /dev, /etc, ...), whatever
# "..", symlink or glob led there. A path or glob that matches nothing is an error
# unless opt_missing_ok is 1.
fc_stage_remove() {
    local p real shown i
    local -a found=() refused=() missing=()
    for i in "${!opt_paths[@]}"; do
        p=${opt_paths[i]}
        if [[ -z $p ]]; then
            refused+=("(empty path)")
            continue
        fi
        local -a exp=()
        if ((opt_globs[i])); then
            # IFS empty: the value is globbed but never word-split.
            local IFS=''
            shopt -s nullglob
            # shellcheck disable=SC2206  # globbing the value is the point here
            exp=($p)
            shopt -u nullglob
            unset IFS
        elif [[ -e $p || -L $p ]]; then
            exp=("$p")
        fi
        if ((${#exp[@]} == 0)); then
            missing+=("$p")
            continue
        fi
        for shown in "${exp[@]}"; do
            real=$(realpath -m -- "$shown")
            if [[ $real != /*/* ]]; then
                refused+=("$shown (resolves to $real)")
            else
                found+=("$shown")
            fi
        done
    done
    FC_MATCHED=${#found[@]}
    if ((${#refused[@]})); then
        FC_STATUS=failed
        FC_MESSAGE="refusing to remove: ${refused[*]}"
        return 0
    fi
    for p in "${found[@]}"; do
        if ((FC_CHECK)); then
            fc_rec change "$FC_IDX" "would remove $p"
        elif out=$(rm -rf --one-file-system -- "$p" 2>&1); then
            fc_rec change "$FC_IDX" "removed $p"
        else
            FC_STATUS=failed
            FC_MESSAGE="cannot remove $p: $out"
            return 0
        fi
    done
    if ((${#missing[@]})) && ((!opt_missing_ok)); then
        FC_STATUS=failed
        FC_MESSAGE="not found: ${missing[*]}"
    elif ((${#found[@]} == 0)); then
        FC_MESSAGE="nothing to remove"
    elif ((FC_CHECK)); then
        FC_STATUS=changed
        FC_MESSAGE="would remove ${#found[@]} path(s)"
    else
        FC_MESSAGE="removed ${#found[@]} path(s)"
    fi
}

# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Verification: poll nvidia-smi until every GPU uses at most opt_max_used_mib MiB or
# opt_timeout_ms pass; then report the GPU rows, the compute apps and the device-file
# holders as records. Any nvidia-smi failure is reported with its own message.
fc_verify() {
    local max=$opt_max_used_mib out rc t0 state line used n over unknown settled=0 left wait_s
    local respawn=""
    local no_number=""
    local -a rows=()
    fc_rec stage verify verify verify
    if ((FC_HALT)); then
        fc_rec verify skipped "$max" 0 "not run: $FC_HALT_REASON"
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        fc_rec nvsmi 127 "nvidia-smi: command not found"
        fc_rec verify error "$max" 0 "nvidia-smi: command not found"
        return 0
    fi
    fc_now_us
    t0=$REPLY
    while :; do
        out=$(nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total \
            --format=csv,noheader,nounits 2>&1)
        rc=$?
        if ((rc != 0)); then
            fc_rec nvsmi "$rc" "$out"
            fc_now_us
            fc_rec verify error "$max" "$(((REPLY - t0) / 1000))" "nvidia-smi exit $rc: $out"
            return 0
        fi
        rows=() n=0 over=0 unknown=0 no_number=""
        while IFS= read -r line; do
            [[ -n ${line//[[:space:]]/} ]] || continue
            rows+=("$line")
            n=$((n + 1))
            # Fields: index, uuid, name, used, total; the name is never split on.
            used=${line%,*}
            used=${used##*,}
            used=${used//[[:space:]]/}
            if [[ $used =~ ^[0-9]+$ ]]; then
                ((used > max)) && over=$((over + 1))
            else
                unknown=$((unknown + 1))
                no_number+=" GPU${line%%,*}=${used:-empty}"
            fi
        done <<<"$out"
        if ((n == 0)); then
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
        [[ $state == dirty ]] || break
        fc_now_us
        # A process this login may not signal (fc_deny) leaves the host dirty whatever
        # the GPUs do next: no point in waiting for them.
        ((FC_CHECK || FC_DENIED_ANY || (REPLY - t0) / 1000 >= opt_timeout_ms)) && break
        fc_nap "$opt_interval_s"
    done
    fc_now_us
    local ms=$(((REPLY - t0) / 1000))
    for line in "${rows[@]}"; do
        fc_rec gpu "$line"
    done
    # Who holds the GPUs matters only where some GPU is still in use; skipping it on a clean
    # host saves two process-table scans and an nvidia-smi call (a fleet-wide status is
    # mostly clean hosts).
    [[ $state == ok ]] || fc_report_holders
    case $state in
        ok) fc_rec verify ok "$max" "$ms" "every GPU at or under $max MiB" ;;
        dirty)
            if [[ -n $respawn ]]; then
                fc_rec verify dirty "$max" "$ms" "respawned after it was killed: $respawn"
            else
                fc_rec verify dirty "$max" "$ms" "$over GPU(s) above $max MiB after ${ms} ms"
            fi
            ;;
        unknown) fc_rec verify unknown "$max" "$ms" \
            "nvidia-smi gave no number for memory.used:$no_number (check the driver: run nvidia-smi on the host)" ;;
        *) fc_rec verify error "$max" "$ms" "nvidia-smi listed no GPU: $out" ;;
    esac
}

# The processes holding GPUs, one record each: device-file holders, else compute apps.
fc_report_holders() {
    local out line pid target any_holder=0
    # Device-file holders first: one `ls` names each process and the GPU it holds. Ask
    # nvidia-smi (a second call, 20 ms of a busy host's status) only when that found
    # nobody, e.g. when the holder lives in a container whose processes we cannot see.
    while read -r pid _ target; do
        [[ $target =~ ^/dev/nvidia[0-9]+$ ]] || continue
        fc_cmdline "$pid"
        fc_rec holder "$pid" "$target" "$REPLY"
        any_holder=1
    done < <(fc_open_fds /dev/nvidia)
    # A login without root sees only its own processes' descriptors; nvidia-smi names
    # everyone's (other users', root's) as the driver knows them.
    ((any_holder && EUID == 0)) && return 0
    if out=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid \
        --format=csv,noheader,nounits 2>/dev/null); then
        while IFS= read -r line; do
            [[ -n ${line//[[:space:]]/} ]] && fc_rec app "$line"
        done <<<"$out"
    fi
}

fc_main() {
    export LC_ALL=C
    PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    FC_PLAYBOOK=post-extraction
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

    # stage 1/6: "guard-writers" (guard)
    fc_reset_opts
    opt_path=''
    opt_wait_for_file=''
    opt_wait_for_line=''
    opt_timeout_ms=0
    fc_stage 1 guard-writers guard

    # stage 2/6: "stop-server" (signal)
    fc_reset_opts
    opt_pattern=sglang.launch_server
    opt_signal=TERM
    opt_grace_ms=10000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 2 stop-server signal

    # stage 3/6: "kill-workers" (signal)
    fc_reset_opts
    opt_pattern=sglang
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 3 kill-workers signal

    # stage 4/6: "kill-gpu-holders" (gpu-holders)
    fc_reset_opts
    opt_filter=''
    opt_signal=TERM
    opt_grace_ms=2000
    opt_kill_wait_ms=3000
    opt_tree=1
    fc_stage 4 kill-gpu-holders gpu-holders

    # stage 5/6: "restore-model" (restore)
    fc_reset_opts
    opt_file=''
    opt_backup_suffix=.bak_hsdump
    fc_stage 5 restore-model restore

    # stage 6/6: "remove-dump" (remove)
    fc_reset_opts
    opt_paths=(/dev/shm/sglang_hs)
    opt_globs=(0)
    opt_missing_ok=1
    fc_stage 6 remove-dump remove

    # verify: every GPU at or under max_used_mib before the deadline
    fc_reset_opts
    opt_max_used_mib=0
    opt_timeout_ms=30000
    opt_interval_s=0.05
    opt_settle_ms=1000
    fc_verify
    fc_finish
}

fc_main </dev/null
