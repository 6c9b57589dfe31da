# shellcheck shell=bash disable=SC2034,SC2154,SC2153,SC2004
# (The FC_* tables are declared in lib.sh and owner.sh, which the linter does not read with
# this file.)
# fleetclean: acting through the owner of each target. Rendered after lib-kill.sh and
# owner.sh into the scripts of the stage types that signal; fc_act_on_targets calls
# fc_owner_act once the targets are known and their owners named (fc_owner_records),
# before any signal. What it does per owner kind is FC_OWNER_ACT[kind], rendered from the
# playbook's owner_* variables:
#   stop    a systemd unit: `systemctl stop --no-block UNIT`, only when its MainPID is a
#           target and it is no infrastructure (FC_INFRA_UNITS, FC_NEVER_STOP); a docker
#           container: `docker stop -t GRACE ID`, then `docker kill ID`, only when a target
#           is its main process or under it (not only processes `docker exec` started),
#           through the daemon that runs it: a rootless one's (its cgroup under
#           user@UID.service) is its user's, `docker -H unix:///run/user/UID/docker.sock`.
#           Targets `docker exec` started are signalled with their exec session, its root
#           (the shell docker exec ran, which may run them in a loop) first
#           (fc_exec_sessions); the container is left running. A Podman container:
#           `podman stop -t GRACE ID`, then `podman kill ID`, only when it runs and a
#           target is its main process or under it (or it shares the host's PID
#           namespace), as the user whose Podman runs it: root's, or a rootless one's (its
#           cgroup under user-UID.slice/user@UID.service) as that user with their runtime
#           dir and no more of root's environment, `runuser -u NAME -- env -i HOME=...
#           XDG_RUNTIME_DIR=/run/user/UID podman` (no daemon: each user's podman knows
#           only that user's containers); one a systemd unit runs (its
#           PODMAN_SYSTEMD_UNIT label: Quadlet, `podman generate systemd`, podman-kube@)
#           is that unit's, stopped as a unit whose MainPID is its conmon. A Slurm
#           job that still runs here (a slurmstepd of it): `scancel JOB` (its every step;
#           slurmd ends the tasks and runs the epilog), by the node's own Slurm client;
#           a finished job's orphan is signalled, scancel would not reach it.
#           Whatever of it is left after the stage's grace gets SIGKILL; a stop that failed
#           leaves the container watched for a respawn. Without systemctl or docker, a
#           daemon that does not answer (in 10 s; a rootless one's socket that is not its
#           user's, or whose answer is not of that container): signals, and a warning that
#           the owner may start it again (and what to run).
#   refuse  never signalled: a "refused" record naming the owner and what to do (for a
#           target `docker exec` started, its exec session's processes to kill, not
#           `docker stop`); the verification does not wait for GPUs only such processes
#           hold; the host is dirty.
#   signal  left to the caller's signals, as any process (one `docker exec` started
#           watched for a respawn as one is under stop: fc_owner_may_restart).
# A unit or container that also runs a protected process, or the teardown itself, is never
# stopped: its targets are signalled one by one.

declare -gA FC_OWNER_ACT=() FC_REFUSED=() FC_OWNER_WHO=() FC_OWNER_FIX=()
# FC_OWNER_EXEC[pid]: "MAIN SHIM" for a target `docker exec` started in its container
# (fc_docker_exec_only): the container's main process and the containerd-shim above both.
declare -gA FC_OWNER_EXEC=()
# FC_EXEC_SEEN[pid]: the start time of a process this run found in an exec session
# (fc_docker_exec_only, fc_exec_sessions: all of an ended session's tree, what it signals
# and what it leaves), across the script's stages: once its session's root is gone (a
# SIGKILL), it is the container's main process's child, yet still no job of it; a job
# stuck in D after SIGKILL, or a sibling left running, must not have a later stage stop
# the whole container (and its other exec sessions) for it.
declare -gA FC_EXEC_SEEN=()
# FC_EXEC_FIRST: the roots of the exec sessions this stage ends (fc_exec_sessions), first
# in FC_TARGETS, so first to get the stage's signal (or SIGKILL at once where they ignore
# it: fc_exec_kill_roots); FC_EXEC_MORE: the rest of those sessions.
# FC_EXEC_ASKED[container id]: docker was asked this stage which of its targets docker
# exec started (fc_owner_exec_asked).
declare -ga FC_EXEC_FIRST=() FC_EXEC_MORE=()
declare -gA FC_EXEC_ASKED=()
declare -ga FC_NEVER_STOP=() FC_OWNER_LEFT=() FC_DOCKER=() FC_PODMAN=() FC_CTR=()
FC_OWNER_SAID="" FC_OWNER_KEPT=0 FC_OWNER_SENT=0 FC_DOCKER_DOWN=""
# FC_PODMAN_INFO[REF]: podman's answer for container REF (ID, or ID@UID for a user's) this
# stage (fc_podman_inspect); FC_PODMAN_HUNG[podman command line]: it did not answer in 10
# s, across stages; FC_CONMON[pid]: the conmon of target pid's container, where podman
# named it and pid is its main process or under it.
declare -gA FC_PODMAN_INFO=() FC_PODMAN_HUNG=() FC_CONMON=()

# Units that hold up the node itself, never stopped whatever they run: without pam_systemd
# every ssh login lives in ssh.service, and stopping it would cut every session.
FC_INFRA_UNITS=(ssh.service sshd.service cron.service crond.service 'slurm*.service'
    munge.service 'systemd-*' 'dbus*' '*getty*' containerd.service 'docker.*'
    kubelet.service 'nvidia-*' 'dcgm*' 'nv-hostengine*' 'user@*' 'user-runtime-dir@*')

# True while Slurm job $1 (J or J.STEP) runs here: its steps run under a `slurmstepd:
# [J.S]` on the node. A process the job's cgroup still holds after the last one is gone
# (proctrack/linuxproc lets a worker outlive its job) is a finished job's orphan, no
# running job's: it is signalled as a plain process.
fc_slurm_job_running() {
    local job=${1%%.*} pid
    for pid in "${FC_PIDS[@]}"; do
        [[ ${FC_CMD[$pid]:-} == "slurmstepd: [$job."* ]] && return 0
    done
    return 1
}

# fc_owner_act SIGNAL GRACE_MS KILL_MS: refuse, stop through their owner, or leave to the
# caller's signals each of FC_TARGETS; FC_TARGETS becomes what is left to signal.
# Sets FC_OWNER_SAID (words for the stage's message), FC_OWNER_KEPT (refused),
# FC_OWNER_SENT (stops and signals sent) and FC_OWNER_LEFT (what outlived SIGKILL).
fc_owner_act() {
    local grace_ms=$2 kill_ms=$3 p kind id owner
    local -A owned=() to_refuse=()
    local -a keep=() stop=() pids=()
    FC_OWNER_SAID="" FC_OWNER_KEPT=0 FC_OWNER_SENT=0 FC_OWNER_LEFT=()
    FC_EXEC_FIRST=() FC_EXEC_MORE=() FC_EXEC_ASKED=() FC_PODMAN_INFO=()
    for p in "${FC_TARGETS[@]}"; do
        [[ ${FC_OK[$p]:-} == podman ]] && fc_podman_unit_of "$p"
        kind=${FC_OK[$p]:-plain} id=${FC_OI[$p]:-}
        [[ $kind == podman ]] && fc_podman_ref "$p" && id=$REPLY
        case ${FC_OWNER_ACT[$kind]:-signal}:$kind in
            refuse:slurm)
                if fc_slurm_job_running "$id"; then
                    fc_owner_refuse "$p"
                else
                    keep+=("$p")
                fi
                ;;
            stop:slurm)
                # A finished job's orphan (no slurmstepd of the job left) is a stray:
                # signalled, as under refuse; scancel would not reach it.
                if fc_slurm_job_running "$id"; then
                    owned[slurm ${id%%.*}]+=" $p"
                else
                    keep+=("$p")
                fi
                ;;
            refuse:docker) to_refuse[$id]+=" $p" ;;
            refuse:*) fc_owner_refuse "$p" ;;
            stop:systemd | stop:docker | stop:podman) owned[$kind $id]+=" $p" ;;
            *) keep+=("$p") ;;
        esac
    done
    for id in "${!to_refuse[@]}"; do
        read -r -a pids <<<"${to_refuse[$id]}"
        # Which docker exec started: their refusal names the exec session, not the
        # container (fc_owner_refusal).
        command -v docker >/dev/null 2>&1 && fc_docker_exec_only "$id" "${pids[@]}"
        for p in "${pids[@]}"; do
            fc_owner_refuse "$p"
        done
    done
    for owner in "${!owned[@]}"; do
        read -r -a pids <<<"${owned[$owner]}"
        if fc_owner_stoppable "${owner%% *}" "${owner#* }" "${pids[@]}"; then
            stop+=("${pids[@]}")
        else
            keep+=("${pids[@]}")
        fi
    done
    FC_TARGETS=("${keep[@]}")
    ((${#FC_EXEC_FIRST[@]})) && fc_exec_targets
    if ((${#stop[@]})) && ((FC_CHECK)); then
        for p in "${stop[@]}"; do
            fc_owner_stop_words "$p"
            fc_rec change "$FC_IDX" "would stop $REPLY: $p (${FC_CMD[$p]})"
        done
    elif ((${#stop[@]})); then
        fc_owner_stop "$grace_ms" "$kill_ms" "${stop[@]}"
    fi
    ((${#FC_EXEC_FIRST[@]})) && fc_exec_kill_roots "$1" "$kill_ms"
    return 0
}

# fc_owner_stoppable KIND ID PID...: true when the unit or container ID may be stopped for
# these targets of it. Else its targets are signalled one by one: silently where that is
# the rule (infrastructure, a MainPID that is no target), with a warning (the owner may
# start them again) where the tool is missing or the owner runs a protected process.
fc_owner_stoppable() {
    local kind=$1 id=$2 unit=${2##*/} pat main
    shift 2
    if [[ $kind == systemd ]]; then
        for pat in "${FC_INFRA_UNITS[@]}" "${FC_NEVER_STOP[@]}"; do
            # shellcheck disable=SC2053
            [[ $unit == $pat ]] && return 1
        done
        if ! command -v systemctl >/dev/null 2>&1; then
            fc_owner_warn "no systemctl on the node: $unit's processes were signalled; the unit may restart them"
            return 1
        fi
        fc_owner_systemctl "$id"
        main=$("${FC_SYSTEMCTL[@]}" show -p MainPID --value "$unit" 2>/dev/null)
        [[ $main =~ ^[1-9][0-9]*$ ]] || return 1
        # Only a unit whose main process is itself a target, or uses a GPU itself, is ours
        # to stop: a unit that merely forked a GPU job (a login shell's service, a
        # scheduler, an agent that watches the GPUs through NVML: every GPU's file open,
        # no /dev/nvidia-uvm) is not.
        # A unit that runs a Podman container (Quadlet, `podman generate systemd`) has the
        # container's conmon for its MainPID (podman tells systemd so): ours where a target
        # is that container's main process or under it (not a `podman exec` job, whose
        # conmon is its own).
        fc_in_list "$main" "$@" || fc_in_list "$main" "${FC_TARGETS[@]}" ||
            fc_uses_gpu "$main" || fc_main_is_conmon "$main" "$@" || return 1
    elif [[ $kind == podman ]]; then
        fc_podman_stoppable "$id" "$@" || return 1
    elif [[ $kind == slurm ]]; then
        # owner-slurm.sh, carried only where owner_slurm is stop (render.library).
        fc_slurm_can_cancel "$id" || return 1
    elif ! command -v docker >/dev/null 2>&1; then
        fc_owner_warn "no docker CLI on the node: container ${id:0:12}'s processes were signalled; its restart policy may start them again"
        return 1
    elif fc_docker_exec_only "$id" "$@"; then
        # As for a unit's forked job: `docker stop` would take down the user's whole
        # container (its main process and all else in it) for them. Their exec session
        # goes with them (a shell that docker exec ran would start them again).
        fc_exec_sessions "$id" "$@"
        FC_OWNER_SAID+="not stopped: docker ${id:0:12} (pid $* started by docker exec, not by its main process ${FC_OWNER_EXEC[$1]%% *}$REPLY); "
        return 1
    elif [[ -n $FC_DOCKER_DOWN ]]; then
        # Its daemon did not answer for it (a rootless container's user's, or any in 10
        # s): no stop can work. Signalled, so watched for a respawn.
        fc_docker_words "$id"
        fc_owner_docker "$id"
        fc_owner_warn "$REPLY: its daemon${FC_DOCKER[2]:+ at ${FC_DOCKER[2]}} did not answer for it ($FC_DOCKER_DOWN): its processes were signalled; its restart policy may start them again; to stop it: ${FC_DOCKER[*]} stop ${id:0:12}"
        return 1
    fi
    if fc_owner_runs_protected "$kind" "$id"; then
        fc_owner_stop_words "$1"
        fc_owner_warn "$REPLY also runs protected pid $FC_OWNER_PROT: not stopped, its targets were signalled; it may restart them"
        return 1
    fi
}

# fc_docker_exec_only ID PID...: true when none of these processes of container ID is its
# main process (docker inspect's State.Pid) or under it: `docker exec` started each, beside
# the main process (their parent is the containerd-shim, as the main process's is, and they
# live in its cgroup and PID namespace). Docker's restart policy never starts them again.
# Sets FC_OWNER_EXEC for each. False where docker cannot name a
# main process (the container not running): as before, the container is stopped; but where
# its daemon did not answer (a rootless one's, or any in 10 s), FC_DOCKER_DOWN says what it
# said. Asked at each stage: a container restarted since has another main process.
# A container that shares the host's PID namespace (`--pid=host`) has no init of its own to
# adopt what its main process double-forked: the shim (a subreaper) does, so such a
# daemonised child looks like an exec'd job, and the main process may run it again. There
# the container is stopped, as before.
declare -gA FC_DOCKER_HUNG=()
fc_docker_exec_only() {
    local id=$1 main mode p q n rc=0
    shift
    FC_DOCKER_DOWN=""
    fc_owner_docker "$id"
    if [[ -n ${FC_DOCKER_UID[$id]:-} ]] && ! fc_docker_socket_ours "${FC_DOCKER_UID[$id]}"
    then
        FC_DOCKER_DOWN=$REPLY
        return 1
    elif [[ -n ${FC_DOCKER_HUNG[${FC_DOCKER[*]}]:-} ]]; then
        # One daemon that hangs costs one wait, not one for each of its containers.
        main="" rc=124
    elif command -v timeout >/dev/null 2>&1; then
        # Bounded, as docker kill: a daemon that hangs would hold the teardown here.
        main=$(timeout -k 1 10 "${FC_DOCKER[@]}" inspect \
            -f '{{.State.Pid}} {{.HostConfig.PidMode}}' "$id" 2>&1) || rc=$?
    else
        main=$("${FC_DOCKER[@]}" inspect -f '{{.State.Pid}} {{.HostConfig.PidMode}}' "$id" \
            2>&1) || rc=$?
    fi
    if ((rc == 124 || rc == 137)); then
        # No stop would answer either: signalled, watched, and said. (137: the CLI let
        # timeout's TERM pass and took its KILL.)
        FC_DOCKER_HUNG[${FC_DOCKER[*]}]=1
        FC_DOCKER_DOWN="no answer in 10 s"
    elif ((rc)) && [[ -n ${FC_DOCKER_UID[$id]:-} ]]; then
        FC_DOCKER_DOWN=${main%%$'\n'*}
        FC_DOCKER_DOWN=${FC_DOCKER_DOWN:-exit $rc}
    fi
    main=${main##*$'\n'}
    read -r main mode <<<"$main"
    ((rc == 0)) && [[ $main =~ ^[1-9][0-9]*$ ]] || return 1
    # A user's socket answers for what that user says: its main process must be in the
    # container's own cgroup under that user's manager (a process the user put in a
    # scope named after a root container's ID, and a daemon of theirs naming the
    # container's main process, would otherwise have root act on root's container).
    if [[ -n ${FC_DOCKER_UID[$id]:-} ]] && ! fc_docker_main_ours "$id" "$main"; then
        FC_DOCKER_DOWN=$REPLY
        return 1
    fi
    # Only a PID namespace of its own has an init that adopts what it double-forks:
    # "host", or "container:ID" (another's namespace, whose init adopts them), do not.
    [[ -z $mode || $mode == private ]] || return 1
    for p in "$@"; do
        # Found in an exec session earlier in this run (FC_EXEC_SEEN): still exec'd,
        # whatever adopted it since.
        [[ -n ${FC_START[$p]:-} && ${FC_EXEC_SEEN[$p]:-} == "${FC_START[$p]}" ]] && continue
        q=$p n=0
        while [[ -n $q && $q != 0 && $q != 1 ]] && ((n++ < 64)); do
            [[ $q == "$main" ]] && return 1
            [[ -n ${FC_START[$q]:-} ]] || fc_proc_load "$q" || break
            q=${FC_PPID[$q]:-0}
        done
    done
    [[ -n ${FC_START[$main]:-} ]] || fc_proc_load "$main"
    for p in "$@"; do
        FC_OWNER_EXEC[$p]="$main ${FC_PPID[$main]:-0}"
        FC_EXEC_SEEN[$p]=${FC_START[$p]:-}
    done
}

# fc_exec_root PID: REPLY = the root of the exec session of PID, a target `docker exec`
# started (FC_OWNER_EXEC): its ancestor (or itself) whose parent is the containerd-shim,
# the process docker exec ran (the shell of `docker exec CTR sh -c 'while :; do ...;
# done'` or of `docker exec -it CTR bash`, or the job itself). Fails where the ancestry
# does not reach the shim (a process the container's init adopted: its root killed earlier
# in this run, FC_EXEC_SEEN) or that root is dead, or is the container's main process.
fc_exec_root() {
    local q=$1 n=0 main=${FC_OWNER_EXEC[$1]%% *} shim=${FC_OWNER_EXEC[$1]#* }
    [[ $shim =~ ^[1-9][0-9]*$ && $shim != 1 ]] || return 1
    while [[ ${FC_PPID[$q]:-0} != "$shim" ]]; do
        [[ $q != "$main" ]] || return 1
        q=${FC_PPID[$q]:-0}
        [[ $q != 0 && $q != 1 ]] && ((++n <= 64)) || return 1
        [[ -n ${FC_START[$q]:-} ]] || fc_proc_load "$q" || return 1
    done
    [[ $q != "$main" && ${FC_STATE[$q]:-} != [ZX] && -n ${FC_CMD[$q]:-} ]] || return 1
    REPLY=$q
}

# fc_exec_tree ROOT [TARGET...]: FC_TREE = what of the exec session ROOT leads is ended
# with these TARGETs of it: the chain from ROOT down to each (ROOT, and each ancestor
# between ROOT and the target: a loop among them would start it again), and each target's
# own tree (its descendants and the members of the process groups and sessions they lead:
# fc_expand's tree). The rest of the session (a CPU-only child ROOT also started, a
# jupyter kernel, an editor, `tensorboard &`, a tmux server) is left running: ROOT's end
# reparents it, and it starts nothing again. TARGETs not under ROOT are not its. False
# (REPLY says why) where one of these is protected (or out of the scope, or the teardown
# itself), or this login may not signal ROOT: ending the session would reach what must
# not be. The stage's own TARGETs are not asked again.
fc_exec_tree() {
    local root=$1 p q n
    local -A seen=([$1]=1) targets=() in_tree=()
    local -a queue=() chain=()
    for p in "${@:2}"; do
        targets[$p]=1
    done
    FC_TREE=()
    # ROOT, then the chain of each target under it, the target last: the chain's
    # processes alone (what they lead beside it is not the job's).
    fc_exec_tree_add "$root" || return 1
    for p in "${@:2}"; do
        chain=() q=$p n=0
        while [[ $q != "$root" ]]; do
            chain=("$q" "${chain[@]}")
            q=${FC_PPID[$q]:-0}
            if [[ $q == 0 || $q == 1 ]] || ((++n > 64)); then
                break
            fi
        done
        [[ $q == "$root" ]] || continue
        queue+=("$p")
        seen[$p]=1
        for q in "${chain[@]}"; do
            [[ $q == "$p" || -n ${targets[$q]:-} ]] && continue
            fc_exec_tree_add "$q" || return 1
            seen[$q]=1
        done
    done
    # Each target's own tree, as before.
    while ((${#queue[@]})); do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        fc_exec_tree_add "$p" || return 1
        fc_members "$p"
        for q in "${FC_MEMBERS[@]}"; do
            [[ -z ${seen[$q]:-} ]] || continue
            seen[$q]=1
            queue+=("$q")
        done
    done
    if ! fc_may_signal "$root"; then
        fc_proc_user "$root"
        REPLY="is $REPLY's, which this login may not signal"
        return 1
    fi
    REPLY=""
}

# fc_exec_tree_add PID (fc_exec_tree's; its targets and in_tree): PID joins FC_TREE, once,
# where it lives; false (REPLY says why) where it is protected and no target.
fc_exec_tree_add() {
    local p=$1
    [[ -z ${in_tree[$p]:-} ]] || return 0
    in_tree[$p]=1
    [[ -n ${FC_START[$p]:-} && ${FC_STATE[$p]:-} != [ZX] && -n ${FC_CMD[$p]:-} ]] || return 0
    if [[ -z ${targets[$p]:-} ]] && fc_protected "$p"; then
        REPLY="runs protected pid $p (${FC_CMD[$p]}: $REPLY)"
        return 1
    fi
    FC_TREE+=("$p")
}

# fc_exec_sessions ID PID...: these targets of container ID `docker exec` started are
# stopped with their exec sessions: each session's root (fc_exec_root) goes to
# FC_EXEC_FIRST, signalled before the rest (a loop it runs cannot start the job again),
# and the chain from it down to each target and each target's tree (fc_exec_tree) to
# FC_EXEC_MORE; nothing else of the session or the container is touched (all of the
# session is remembered as exec'd: FC_EXEC_SEEN). REPLY: ": its exec session 20 (sh)
# signalled first" for the roots that are no targets themselves, else "". A session that
# cannot be ended so (a protected process on a target's chain or in its tree, a root this
# login may not signal) is left with a warning: its targets are
# signalled alone, their parent watched for a respawn (fc_owner_may_restart).
fc_exec_sessions() {
    local id=$1 p root listed_roots=""
    local -A roots=() targets=()
    shift
    for p in "$@"; do
        targets[$p]=1
        fc_exec_root "$p" && roots[$REPLY]=1
    done
    for root in "${!roots[@]}"; do
        if ! fc_exec_tree "$root" "$@"; then
            fc_owner_warn "docker ${id:0:12}: exec session $root (${FC_CMD[$root]}) $REPLY: not ended, only its targets were signalled; it may start them again"
            continue
        fi
        FC_EXEC_FIRST+=("$root")
        FC_EXEC_MORE+=("${FC_TREE[@]}")
        fc_exec_seen "$root"
        for p in "${FC_TREE[@]}"; do
            FC_OWNER_EXEC[$p]=${FC_OWNER_EXEC[$1]}
            [[ -n ${targets[$p]:-} ]] || FC_RELWHY[$p]="docker exec session $root"
        done
        [[ -n ${targets[$root]:-} ]] || listed_roots+="${listed_roots:+, }$root (${FC_COMM[$root]:-?})"
    done
    REPLY=""
    if [[ $listed_roots == *,* ]]; then
        REPLY=": its exec sessions $listed_roots signalled first"
    elif [[ -n $listed_roots ]]; then
        REPLY=": its exec session $listed_roots signalled first"
    fi
}

# fc_exec_seen ROOT: the exec session ROOT leads, all of it (its descendants and the
# members of the process groups and sessions they lead, what is signalled and what is
# left), is remembered as exec'd (FC_EXEC_SEEN) for the rest of the run.
fc_exec_seen() {
    local p q
    local -A seen=([$1]=1)
    local -a queue=("$1")
    while ((${#queue[@]})); do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        [[ -n ${FC_START[$p]:-} ]] && FC_EXEC_SEEN[$p]=${FC_START[$p]}
        fc_members "$p"
        for q in "${FC_MEMBERS[@]}"; do
            [[ -z ${seen[$q]:-} ]] || continue
            seen[$q]=1
            queue+=("$q")
        done
    done
}

# What is left to signal (FC_TARGETS) with the exec sessions fc_exec_sessions ends: their
# roots first, then the rest, numerically. What joins the targets gets the records a
# target has (owner, match) and counts as matched; under --check, only what no earlier
# stage would have signalled joins (FC_CLAIMED).
fc_exec_targets() {
    local p
    local -A have=() first=()
    local -a added=() rest=() leads=()
    for p in "${FC_TARGETS[@]}"; do
        have[$p]=1
    done
    for p in "${FC_EXEC_FIRST[@]}" "${FC_EXEC_MORE[@]}"; do
        [[ -n ${have[$p]:-} ]] && continue
        have[$p]=1
        if ((FC_CHECK)); then
            [[ -n ${FC_CLAIMED[$p]:-} ]] && continue
            FC_CLAIMED[$p]=1
        fi
        added+=("$p")
    done
    for p in "${FC_EXEC_FIRST[@]}"; do
        [[ " ${FC_TARGETS[*]} ${added[*]} " == *" $p "* ]] || continue
        first[$p]=1
        leads+=("$p")
    done
    for p in "${FC_TARGETS[@]}" "${added[@]}"; do
        [[ -n ${first[$p]:-} ]] || rest+=("$p")
    done
    if ((${#rest[@]})); then
        mapfile -t rest < <(printf '%s\n' "${rest[@]}" | sort -n -u)
    fi
    FC_TARGETS=("${leads[@]}" "${rest[@]}")
    FC_EXEC_FIRST=("${leads[@]}")
    ((${#added[@]})) || return 0
    fc_owner_records "${added[@]}"
    fc_note_related "${added[@]}"
    for p in "${added[@]}"; do
        fc_rec match "$FC_IDX" "$p" "${FC_CMD[$p]}" tree "${FC_IDENT[$p]:-}"
    done
    FC_MATCHED=$((FC_MATCHED + ${#added[@]}))
}

# fc_exec_kill_roots SIGNAL KILL_MS: an exec session's root that ignores the stage's
# SIGNAL (the interactive bash of `docker exec -it CTR bash` ignores TERM) would outlive
# the grace and run its job anew meanwhile: it gets SIGKILL now, before the stage's
# signals reach the rest (FC_TARGETS keeps them), as a stop's signals (FC_OWNER_SENT,
# FC_OWNER_LEFT); --check says so.
fc_exec_kill_roots() {
    local sig=$1 kill_ms=$2 p owner
    local -a kill=() keep=()
    local -A start=() cmd=()
    [[ $sig == KILL ]] && return 0
    for p in "${FC_EXEC_FIRST[@]}"; do
        fc_ignores "$p" "$sig" && kill+=("$p")
    done
    ((${#kill[@]})) || return 0
    for p in "${FC_TARGETS[@]}"; do
        [[ " ${kill[*]} " == *" $p "* ]] || keep+=("$p")
    done
    FC_TARGETS=("${keep[@]}")
    if ((FC_CHECK)); then
        for p in "${kill[@]}"; do
            fc_owner_words "$p"
            owner=$REPLY
            fc_why_text "$p"
            fc_rec change "$FC_IDX" "would send KILL to $p (${FC_CMD[$p]})$owner [$REPLY]"
        done
        return 0
    fi
    for p in "${kill[@]}"; do
        start[$p]=${FC_START[$p]} cmd[$p]=${FC_CMD[$p]}
    done
    FC_SIGNALLED=0
    fc_send KILL "${kill[@]}"
    fc_wait_gone "$kill_ms" "${kill[@]}"
    FC_OWNER_SENT=$((FC_OWNER_SENT + FC_SIGNALLED))
    FC_OWNER_LEFT+=("${FC_LEFT[@]}")
}

# True when PID ignores signal $2 (a name: TERM), as its SigIgn mask says.
fc_ignores() {
    # Its own REPLY: its callers build theirs around it.
    local n REPLY
    n=$(kill -l "$2" 2>/dev/null) && [[ $n =~ ^[0-9]+$ ]] || return 1
    fc_proc_field "/proc/$1/status" SigIgn && [[ $REPLY =~ ^[0-9a-fA-F]+$ ]] || return 1
    (((16#$REPLY >> (n - 1)) & 1))
}

# fc_owner_exec_asked PID: under `owner_docker: signal`, whether docker exec started the
# targets of PID's container is asked once a stage, where the respawn watch needs it
# (fc_owner_may_restart): FC_OWNER_EXEC as under stop. Nothing asked without a docker CLI,
# or where the answer is known.
fc_owner_exec_asked() {
    local kind=${FC_OK[$1]:-} id=${FC_OI[$1]:-} p
    local -a mine=()
    [[ $kind == podman ]] && fc_podman_ref "$1" && id=$REPLY
    [[ ${FC_OWNER_ACT[$kind]:-signal} == signal && -z ${FC_OWNER_EXEC[$1]:-} && -n $id &&
        -z ${FC_EXEC_ASKED[$id]:-} ]] || return 0
    FC_EXEC_ASKED[$id]=1
    command -v "$kind" >/dev/null 2>&1 || return 0
    for p in "${FC_TARGETS[@]}"; do
        [[ ${FC_OK[$p]:-} == "$kind" ]] || continue
        if [[ $kind == podman ]]; then
            fc_podman_ref "$p"
            [[ $REPLY == "$id" ]] && mine+=("$p")
        elif [[ ${FC_OI[$p]:-} == "$id" ]]; then
            mine+=("$p")
        fi
    done
    ((${#mine[@]})) || mine=("$1")
    if [[ $kind == podman ]]; then
        fc_podman_inspect "$id" && ((FC_PI_MAIN)) && fc_podman_exec_only "$id" "${mine[@]}"
    else
        fc_docker_exec_only "$id" "${mine[@]}"
    fi
    return 0
}

# True when /run/user/UID/docker.sock, where a rootless daemon of user UID listens, is a
# socket of that user's, not a link (to root's socket, say): the user owns the directory,
# and root would follow a link put there. Else REPLY says why. (FC_RUN_USER: the tests'
# stand-in for /run/user.)
fc_docker_socket_ours() {
    local sock=${FC_RUN_USER:-/run/user}/$1/docker.sock owner
    if [[ -L $sock || ! -S $sock ]]; then
        REPLY="no socket of its own at $sock"
        return 1
    fi
    owner=$(stat -c %u -- "$sock" 2>/dev/null)
    [[ $owner == "$1" ]] && return 0
    REPLY="$sock belongs to uid ${owner:-?}, not $1"
    return 1
}

# True when pid $2, which a rootless daemon named as container $1's main process, lives in
# that container's cgroup under its user's manager. Else REPLY says why.
fc_docker_main_ours() {
    local text=""
    { read -r -d '' text <"${FC_PROC:-/proc}/$2/cgroup"; } 2>/dev/null
    [[ $text == *"/user@${FC_DOCKER_UID[$1]}.service/"*"docker-$1.scope"* ]] && return 0
    REPLY="it named pid $2 as its main process, which is not in the container's cgroup"
    return 1
}

# True (FC_OWNER_PROT names the pid) when a protected process, or the teardown itself,
# runs in the unit or container KIND ID: stopping that would kill it too.
fc_owner_runs_protected() {
    local q
    for q in "${FC_PIDS[@]}"; do
        fc_protected "$q" || continue
        [[ $q == 1 || $REPLY == "kernel thread" ]] && continue
        fc_owner "$q"
        fc_owner_key
        if [[ $FC_OWNER_KIND == "$1" && $REPLY == "$2" ]]; then
            FC_OWNER_PROT="$q (${FC_CMD[$q]:-${FC_COMM[$q]:-}})"
            return 0
        fi
    done
    return 1
}

# FC_SYSTEMCTL: the systemctl command line that reaches the manager of unit id $1 (a user
# unit, user@UID.service/NAME, is its user's manager's).
fc_owner_systemctl() {
    FC_SYSTEMCTL=(systemctl)
    if [[ $1 =~ ^user@([0-9]+)\.service/ ]]; then
        FC_SYSTEMCTL+=(--user "--machine=${BASH_REMATCH[1]}@.host")
    fi
}

# FC_DOCKER: the docker command line that reaches the daemon of container $1: root's (the
# CLI's own choice), or a rootless container's user's (FC_DOCKER_UID), listening on its
# $XDG_RUNTIME_DIR/docker.sock, /run/user/UID/docker.sock, which root may use too. Root's
# daemon knows nothing of the user's containers: a `docker stop` there fails, and the
# user's daemon starts the killed container again by its restart policy.
fc_owner_docker() {
    FC_DOCKER=(docker)
    if [[ -n ${FC_DOCKER_UID[$1]:-} ]]; then
        FC_DOCKER+=(-H "unix://${FC_RUN_USER:-/run/user}/${FC_DOCKER_UID[$1]}/docker.sock")
    fi
}

# FC_CTR: the command line that reaches container $2 of kind $1 (docker or podman).
fc_ctr_cli() {
    if [[ $1 == podman ]]; then
        fc_owner_podman "$2"
        FC_CTR=("${FC_PODMAN[@]}")
    else
        fc_owner_docker "$2"
        FC_CTR=("${FC_DOCKER[@]}")
    fi
}

# REPLY: the Podman container of target PID as podman is asked of it: its id, and for a
# rootless one "@UID", the user whose podman runs it (FC_OU: its own cgroup's, never
# another process's that names the same id).
fc_podman_ref() {
    REPLY=${FC_OI[$1]:-}${FC_OU[$1]:+@${FC_OU[$1]}}
}

# REPLY: the owner fc_owner named (FC_OWNER_*) as fc_owner_act keys it: a user's Podman
# container's ID@UID, else its id.
fc_owner_key() {
    REPLY=$FC_OWNER_ID
    [[ $FC_OWNER_KIND == podman && -n $FC_OWNER_UID ]] && REPLY+=@$FC_OWNER_UID
    return 0
}

# FC_PODMAN: the podman command line that reaches Podman container REF $1 (ID, or ID@UID
# for a user's). Podman has no daemon: each user's podman knows only that user's
# containers (their storage, their runtime dir), so a rootless one's is asked as that
# user, with the runtime dir their podman finds its state in (XDG_RUNTIME_DIR=/run/user/
# UID) and none of root's environment (env -i: HOME, USER, LOGNAME, a PATH of the
# system's, XDG_RUNTIME_DIR): root's podman answers "no such container" for it, and a
# kill would have the container's restart policy (carried out by its conmon's exit
# command) start it again. False, with REPLY saying why, where this login cannot be that
# user (root runs runuser, by a name that maps back to the uid) or that user has no
# runtime dir of their own.
FC_PODMAN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fc_owner_podman() {
    local uid="" run
    FC_PODMAN=(podman)
    [[ $1 == *@* ]] && uid=${1#*@}
    [[ -n $uid ]] || return 0
    run=${FC_RUN_USER:-/run/user}/$uid
    fc_as_user "$uid" "its podman"
    local rc=$?
    if ((EUID == 0)); then
        FC_PODMAN=("${FC_AS[@]}" "XDG_RUNTIME_DIR=$run" podman)
    else
        FC_PODMAN=(env "XDG_RUNTIME_DIR=$run" podman)
    fi
    if ((rc)); then
        return 1
    elif [[ -L $run || ! -d $run ]]; then
        REPLY="no runtime dir of its own at $run"
        return 1
    fi
    local owner
    owner=$(stat -c %u -- "$run" 2>/dev/null)
    [[ $owner == "$uid" ]] && return 0
    REPLY="$run belongs to uid ${owner:-?}, not $uid"
    return 1
}

# FC_AS: the words that run a command as uid $1 with none of this login's environment
# (root: `runuser -u NAME -- env -i HOME=... USER=... LOGNAME=... PATH=...`; the user
# itself: none). False, REPLY saying why (WHAT, $2, in the words: "its podman"), where this
# login cannot be that user: another non-root login, a uid with no name, or a name that
# maps to another uid (runuser looks the name up again: a second account of that name in
# the directory would have root run a command as someone else).
fc_as_user() {
    local uid=$1 name owner="" line="" home=/
    FC_AS=()
    fc_user_name "$uid"
    name=$REPLY
    if ((EUID == 0)); then
        [[ $name != "$uid" ]] &&
            line=$(timeout 2 getent passwd -- "$name" </dev/null 2>/dev/null)
        IFS=: read -r _ _ owner _ _ home _ <<<"$line"
        FC_AS=(runuser -u "$name" -- env -i "HOME=${home:-/}" "USER=$name" "LOGNAME=$name"
            "PATH=$FC_PODMAN_PATH")
    fi
    if ((EUID != 0 && EUID != uid)); then
        REPLY="only uid $uid ($name) or root may run $2"
        return 1
    elif ((EUID == 0)) && [[ $name == "$uid" ]]; then
        REPLY="uid $uid has no name for runuser"
        return 1
    elif ((EUID == 0)) && [[ $owner != "$uid" ]]; then
        REPLY="the name $name is uid ${owner:-?}'s, not $uid's"
        return 1
    fi
}

# REPLY: Podman container REF $1 in words: "podman 3f2a1c9b8d7e", a rootless one's with
# its user, "podman 3f2a1c9b8d7e (rootless, uid 1000 alice)".
fc_podman_words() {
    local uid=""
    [[ $1 == *@* ]] && uid=${1#*@}
    fc_ctr_words podman "${1%@*}" "$uid"
}

# REPLY: container ID $2 of kind $1 (docker, podman) in words, a rootless one's (run by
# uid $3) with its user: "podman 3f2a1c9b8d7e (rootless, uid 1000 alice)".
fc_ctr_words() {
    if [[ -z $3 ]]; then
        REPLY="$1 ${2:0:12}"
        return 0
    fi
    fc_user_name "$3"
    [[ $REPLY == "$3" ]] && REPLY="" || REPLY=" $REPLY"
    REPLY="$1 ${2:0:12} (rootless, uid $3$REPLY)"
}

# fc_podman_inspect REF: podman's answer for container REF, once a stage (one call: a
# container restarted since has another main process): FC_PI_MAIN (its main process, 0
# when it does not run), FC_PI_CONMON (its conmon), FC_PI_MODE (its PID namespace:
# private, host, container:ID, ns:PATH) and FC_PI_UNIT (its PODMAN_SYSTEMD_UNIT label:
# the unit that runs it). False where podman is missing (FC_PODMAN_DOWN empty) or cannot
# be asked or did not answer (FC_PODMAN_DOWN says so). A hung podman (10 s) is not asked
# again this run, for any container of that user's. A user's answer is taken only where
# the main process it names lives in that container's cgroup under that user's manager:
# the user's podman reads the user's own storage, which may name any process.
fc_podman_inspect() {
    local ref=$1 id=${1%@*} uid="" out="" rc=0 text=""
    [[ $ref == *@* ]] && uid=${ref#*@}
    FC_PI_MAIN=0 FC_PI_CONMON=0 FC_PI_MODE="" FC_PI_UNIT="" FC_PODMAN_DOWN=""
    if [[ -z ${FC_PODMAN_INFO[$ref]+set} ]]; then
        command -v podman >/dev/null 2>&1 || return 1
        if ! fc_owner_podman "$ref"; then
            FC_PODMAN_INFO[$ref]="!$REPLY"
        elif [[ -n ${FC_PODMAN_HUNG[${FC_PODMAN[*]}]:-} ]]; then
            FC_PODMAN_INFO[$ref]="!${FC_PODMAN[*]} inspect said: no answer in 10 s"
        else
            local fmt='{{.State.Pid}}|{{.State.ConmonPid}}|{{.HostConfig.PidMode}}|{{index .Config.Labels "PODMAN_SYSTEMD_UNIT"}}|'
            if command -v timeout >/dev/null 2>&1; then
                out=$(timeout -k 1 10 "${FC_PODMAN[@]}" inspect --format "$fmt" "$id" 2>&1) ||
                    rc=$?
            else
                out=$("${FC_PODMAN[@]}" inspect --format "$fmt" "$id" 2>&1) || rc=$?
            fi
            if ((rc == 124 || rc == 137)); then
                FC_PODMAN_HUNG[${FC_PODMAN[*]}]=1
                out="no answer in 10 s"
            elif ((rc)); then
                out=${out%%$'\n'*}
            fi
            ((rc)) && out="!${FC_PODMAN[*]} inspect said: ${out:-exit $rc}"
            FC_PODMAN_INFO[$ref]=${out##*$'\n'}
        fi
    fi
    out=${FC_PODMAN_INFO[$ref]}
    if [[ $out == '!'* ]]; then
        FC_PODMAN_DOWN=${out#!}
        return 1
    fi
    IFS='|' read -r FC_PI_MAIN FC_PI_CONMON FC_PI_MODE FC_PI_UNIT _ <<<"$out"
    [[ $FC_PI_MAIN =~ ^[0-9]+$ ]] || FC_PI_MAIN=0
    [[ $FC_PI_CONMON =~ ^[0-9]+$ ]] || FC_PI_CONMON=0
    # A unit's name, nothing else ("<no value>": no such label, as some templates say).
    [[ $FC_PI_UNIT =~ ^[A-Za-z0-9:_.@-]+\.service$ ]] || FC_PI_UNIT=""
    if [[ -n $uid ]] && ((FC_PI_MAIN)); then
        { read -r -d '' text <"${FC_PROC:-/proc}/$FC_PI_MAIN/cgroup"; } 2>/dev/null
        if [[ $text != *"/user.slice/user-$uid.slice/user@$uid.service/"*"/libpod-$id.scope"* &&
            $text != *"/user.slice/user-$uid.slice/user@$uid.service/"*"/libpod-payload-$id"* ]]; then
            FC_PODMAN_DOWN="its podman named pid $FC_PI_MAIN as its main process, which is not in the container's cgroup"
            FC_PI_MAIN=0 FC_PI_CONMON=0
            return 1
        fi
    fi
    return 0
}

# fc_under PID TOP: true when PID is TOP or under it (its ancestors, 64 at most).
fc_under() {
    local q=$1 n=0
    while [[ -n $q && $q != 0 && $q != 1 ]] && ((n++ < 64)); do
        [[ $q == "$2" ]] && return 0
        [[ -n ${FC_START[$q]:-} ]] || fc_proc_load "$q" || return 1
        q=${FC_PPID[$q]:-0}
    done
    return 1
}

# REPLY: the nearest conmon above PID (its parent for a container's main process or for a
# job podman exec ran: each exec session has a conmon of its own), or 0.
fc_conmon_above() {
    local q=${FC_PPID[$1]:-0} n=0
    REPLY=0
    while [[ -n $q && $q != 0 && $q != 1 ]] && ((n++ < 64)); do
        [[ -n ${FC_START[$q]:-} || -n ${FC_COMM[$q]:-} ]] || fc_proc_load "$q" || return 1
        if [[ ${FC_COMM[$q]:-} == conmon ]]; then
            REPLY=$q
            return 0
        fi
        q=${FC_PPID[$q]:-0}
    done
    return 1
}

# True when MAIN, a unit's MainPID, is the conmon of the container that runs one of these
# targets as its main process or under it: podman's word (FC_CONMON), or the nearest
# conmon above the target.
fc_main_is_conmon() {
    local main=$1 p
    shift
    for p in "$@"; do
        [[ ${FC_CONMON[$p]:-} == "$main" ]] && return 0
        fc_conmon_above "$p" && [[ $REPLY == "$main" ]] && return 0
    done
    return 1
}

# fc_podman_unit_of PID: a target of a Podman container that a systemd unit runs (its
# PODMAN_SYSTEMD_UNIT label: Quadlet, `podman generate systemd`, podman-kube@ set it, and
# podman copies it into the container's labels) is that unit's: a user's unit of its
# user's manager for a rootless container. Its owner record is said again. Podman is
# asked only where owner_podman or owner_systemd acts on it.
fc_podman_unit_of() {
    local p=$1 ref unit uid=${FC_OU[$1]:-}
    [[ ${FC_OWNER_ACT[podman]:-signal} != signal || ${FC_OWNER_ACT[systemd]:-signal} != signal ]] ||
        return 0
    fc_podman_ref "$p"
    ref=$REPLY
    fc_podman_inspect "$ref" && [[ -n $FC_PI_UNIT ]] || return 0
    unit=$FC_PI_UNIT
    # Its conmon is the unit's MainPID, for its main process and what runs under it.
    ((FC_PI_MAIN && FC_PI_CONMON)) && fc_under "$p" "$FC_PI_MAIN" && FC_CONMON[$p]=$FC_PI_CONMON
    FC_OK[$p]=systemd FC_OI[$p]=${uid:+user@$uid.service/}$unit FC_ON[$p]=$unit FC_OU[$p]=""
    fc_rec owner "$p" systemd "${FC_OI[$p]}" "$unit"
}

# fc_podman_stoppable REF PID...: true when Podman container REF may be stopped for these
# targets of it: its podman answers (as its user) and names a main process that is one of
# them or above one (or the container shares the host's PID namespace). Where podman is
# missing or cannot be asked, or does not answer in 10 s, a warning says so and what to
# run; the targets are signalled and watched. A container that does not run is not
# stopped (a stop would mark it stopped by the user: an unless-stopped one would stay down
# at the next boot). Targets `podman exec` started (each under its exec session's own
# conmon, beside the main process) are signalled alone, as docker exec's are: a stop would
# take the whole container down for them.
fc_podman_stoppable() {
    local ref=$1 id=${1%@*}
    shift
    fc_podman_words "$ref"
    local ctr=$REPLY
    if ! command -v podman >/dev/null 2>&1; then
        fc_owner_warn "no podman on the node: $ctr's processes were signalled; its restart policy may start them again"
        return 1
    fi
    if ! fc_podman_inspect "$ref"; then
        fc_owner_podman "$ref"
        fc_owner_warn "$ctr: $FC_PODMAN_DOWN: its processes were signalled; its restart policy may start them again; to stop it: ${FC_PODMAN[*]} stop ${id:0:12}"
        return 1
    fi
    if ((FC_PI_MAIN == 0)); then
        FC_OWNER_SAID+="not stopped: $ctr (not running); "
        return 1
    fi
    if fc_podman_exec_only "$ref" "$@"; then
        FC_OWNER_SAID+="not stopped: $ctr (pid $* started by podman exec, not by its main process $FC_PI_MAIN); "
        return 1
    fi
}

# fc_podman_exec_only REF PID...: after fc_podman_inspect REF, true when none of these is
# the container's main process or under it: `podman exec` started each. Sets
# FC_OWNER_EXEC[pid] = "MAIN CONMON", the exec session's own conmon (its parent, or its
# session's), as fc_docker_exec_only does with the shim. A container in the host's PID
# namespace (or another's) has no init of its own: conmon, a subreaper, adopts what its
# main process double-forks, which then looks exec'd; it is never exec-only.
fc_podman_exec_only() {
    local p
    shift
    [[ -z $FC_PI_MODE || $FC_PI_MODE == private ]] || return 1
    for p in "$@"; do
        [[ -n ${FC_START[$p]:-} && ${FC_EXEC_SEEN[$p]:-} == "${FC_START[$p]}" ]] && continue
        fc_under "$p" "$FC_PI_MAIN" && return 1
    done
    for p in "$@"; do
        fc_conmon_above "$p"
        FC_OWNER_EXEC[$p]="$FC_PI_MAIN $REPLY"
        FC_EXEC_SEEN[$p]=${FC_START[$p]:-}
    done
}

# REPLY: container ID $1 in words: "docker 3f2a1c9b8d7e", a rootless one's with the user
# whose daemon runs it, "docker 3f2a1c9b8d7e (rootless, uid 1000 alice)".
fc_docker_words() {
    fc_ctr_words docker "$1" "${FC_DOCKER_UID[$1]:-}"
}

# REPLY: what stopping target PID's owner is, in words: "vllm.service (systemctl stop
# vllm.service)", "docker 3f2a1c9b8d7e (docker stop 3f2a1c9b8d7e)".
fc_owner_stop_words() {
    local id=${FC_OI[$1]:-}
    if [[ ${FC_OK[$1]:-} == systemd ]]; then
        fc_owner_systemctl "$id"
        REPLY="${id##*/} (${FC_SYSTEMCTL[*]} stop ${id##*/})"
    elif [[ ${FC_OK[$1]:-} == slurm ]]; then
        REPLY="Slurm job ${id%%.*} (scancel ${id%%.*})"
    elif [[ ${FC_OK[$1]:-} == podman ]]; then
        fc_podman_ref "$1"
        fc_owner_podman "$REPLY"
        fc_podman_words "$REPLY"
        [[ $REPLY == *")" ]] && REPLY="${REPLY%)}: " || REPLY+=" ("
        REPLY+="${FC_PODMAN[*]} stop ${id:0:12})"
    else
        fc_owner_docker "$id"
        fc_docker_words "$id"
        # "docker ID (rootless, uid 1000 alice: docker -H unix://... stop ID)"
        [[ $REPLY == *")" ]] && REPLY="${REPLY%)}: " || REPLY+=" ("
        REPLY+="${FC_DOCKER[*]} stop ${id:0:12})"
    fi
}

# fc_owner_stop GRACE_MS KILL_MS PID...: stop the owner of each (their units and containers
# at once), wait up to the grace for them to go, `docker kill` the containers and SIGKILL
# whatever is left, wait KILL_MS. One "signal" record per target, signal "stop".
fc_owner_stop() {
    local grace_ms=$1 kill_ms=$2 p id out t k
    shift 2
    local -A start=() cmd=() done_ids=() id_kind=() ref_of=()
    local -a pids=() jobs=() docker_ids=() ctr_cmds=()
    t=$(((grace_ms + 999) / 1000))
    FC_SIGNALLED=0
    # What runs before the stops: should one fail, its container is watched for a respawn
    # as a signalled one's would be (fc_note_respawn_risk), against this.
    if ((!FC_RESPAWN_RISK)); then
        for p in "${FC_PIDS[@]}"; do
            FC_BEFORE[$p]=${FC_START[$p]:-}
        done
    fi
    for p in "$@"; do
        start[$p]=${FC_START[$p]}
        cmd[$p]=${FC_CMD[$p]}
        id=${FC_OI[$p]}
        # A user's Podman container: ID@UID (fc_podman_ref), never only its id.
        [[ ${FC_OK[$p]} == podman ]] && fc_podman_ref "$p" && id=$REPLY
        ref_of[$p]=$id
        if [[ -z ${done_ids[$id]:-} ]]; then
            done_ids[$id]=ok id_kind[$id]=${FC_OK[$p]}
            if [[ ${FC_OK[$p]} == systemd ]]; then
                fc_owner_systemctl "$id"
                if ! out=$("${FC_SYSTEMCTL[@]}" stop --no-block "${id##*/}" 2>&1); then
                    done_ids[$id]=failed
                    fc_owner_warn "${FC_SYSTEMCTL[*]} stop ${id##*/} failed (${out%%$'\n'*}): its processes were signalled; it may restart them"
                fi
            elif [[ ${FC_OK[$p]} == slurm ]]; then
                # The whole job: slurmd ends each step's tasks (SIGTERM, KillWait, SIGKILL)
                # and runs the epilog; what is left after the grace gets SIGKILL below.
                # Bounded: a slurmctld that does not answer held the teardown here.
                if ! fc_slurm_how "${id%%.*}" "$p"; then
                    done_ids[$id]=failed
                    fc_owner_warn "Slurm job ${id%%.*} not cancelled ($REPLY): its processes were signalled; the job may start more; to end it: scancel $FC_SLURM_REF"
                elif ! out=$(fc_slurm_cancel); then
                    done_ids[$id]=failed
                    fc_owner_warn "scancel $FC_SLURM_REF failed (${out%%$'\n'*}): its processes were signalled; the job may start more"
                fi
            else
                # A container: docker's, or podman's (as the user whose podman runs it).
                fc_ctr_cli "${FC_OK[$p]}" "$id"
                "${FC_CTR[@]}" stop -t "$t" "${id%@*}" >/dev/null 2>&1 &
                jobs+=("$!")
                docker_ids+=("$id")
                ctr_cmds+=("${FC_OK[$p]}")
            fi
        fi
        if [[ ${done_ids[$id]} == ok ]]; then
            pids+=("$p")
            fc_rec signal "$FC_IDX" "$p" stop "${cmd[$p]}"
            FC_SIGNALLED=$((FC_SIGNALLED + 1))
        else
            FC_TARGETS+=("$p")
        fi
    done
    fc_now_us
    FC_LAST_SIGNAL_US=$REPLY
    fc_wait_gone "$grace_ms" "${pids[@]}"
    if ((${#FC_LEFT[@]})); then
        for k in "${!docker_ids[@]}"; do
            id=${docker_ids[k]}
            for p in "${FC_LEFT[@]}"; do
                if [[ ${ref_of[$p]} == "$id" ]]; then
                    # Bounded: a daemon that hangs held the teardown (and the node's lock)
                    # here for ever, before the KILL below.
                    fc_ctr_cli "${ctr_cmds[k]}" "$id"
                    if command -v timeout >/dev/null 2>&1; then
                        timeout -k 1 10 "${FC_CTR[@]}" kill "${id%@*}" >/dev/null 2>&1
                    else
                        "${FC_CTR[@]}" kill "${id%@*}" >/dev/null 2>&1 &
                    fi
                    break
                fi
            done
        done
        fc_send KILL "${FC_LEFT[@]}"
        fc_wait_gone "$kill_ms" "${FC_LEFT[@]}"
    fi
    FC_OWNER_LEFT=("${FC_LEFT[@]}")
    FC_OWNER_SENT=$FC_SIGNALLED
    # Our own docker clients: each has returned by now but for a daemon that hangs. One
    # that failed stopped nothing: said so, not "stopped" (a restart policy may bring its
    # container back, as a unit's may after a failed systemctl stop).
    local rc ended
    for k in "${!jobs[@]}"; do
        p=${jobs[k]}
        # A client still finishing its stop (the container's processes went first) gets
        # 2 s before it is ended; ended by us, its status says nothing of the stop.
        ended=0
        for _ in {1..40}; do
            kill -0 "$p" 2>/dev/null || break
            fc_nap 0.05
        done
        kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null && ended=1
        rc=0
        wait "$p" 2>/dev/null || rc=$?
        if ((rc != 0 && !ended)); then
            id=${docker_ids[k]}
            done_ids[$id]=failed
            fc_ctr_cli "${ctr_cmds[k]}" "$id"
            fc_owner_warn "${FC_CTR[*]} stop ${id:0:12} failed (exit $rc): its processes were signalled; a restart policy may bring its container back"
            # Its processes had SIGKILL after the grace, as a signalled container's: the
            # verification watches it as one (fc_owner_may_restart).
            FC_RESPAWN_RISK=1
            FC_WATCH_OWNER[${ctr_cmds[k]} $id]=1
        fi
    done
    for id in "${!done_ids[@]}"; do
        [[ ${done_ids[$id]} == ok ]] || continue
        if [[ $id == */* || $id == *.service ]]; then
            FC_OWNER_SAID+="stopped ${id##*/}; "
        elif [[ ${id_kind[$id]:-} == slurm ]]; then
            FC_OWNER_SAID+="cancelled Slurm job ${FC_SLURM_DONE[$id]:-${id%%.*}}; "
        else
            if [[ ${id_kind[$id]:-} == podman ]]; then
                fc_podman_words "$id"
            else
                fc_docker_words "$id"
            fi
            FC_OWNER_SAID+="stopped $REPLY; "
        fi
    done
}

# fc_owner_refuse PID: PID is its owner's to stop, not ours: a "refused" record (pid,
# command line, who owns it, what to do) and FC_REFUSED[pid] for the verification; in
# --check, a change line instead.
fc_owner_refuse() {
    local p=$1 key=${FC_OK[$1]:-}:${FC_OI[$1]:-}:${FC_ON[$1]:-}:${FC_OU[$1]:-}
    # One docker exec session's targets share what to do: that session's.
    [[ -n ${FC_OWNER_EXEC[$p]:-} ]] && fc_exec_root "$p" && key+=":$REPLY"
    if [[ -z ${FC_OWNER_WHO[$key]+set} ]]; then
        fc_owner_refusal "$p"
        FC_OWNER_WHO[$key]=${REPLY%%$'\t'*} FC_OWNER_FIX[$key]=${REPLY#*$'\t'}
    fi
    local who=${FC_OWNER_WHO[$key]} fix=${FC_OWNER_FIX[$key]}
    FC_OWNER_KEPT=$((FC_OWNER_KEPT + 1))
    if ((FC_CHECK)); then
        fc_rec change "$FC_IDX" "would refuse: $who ($fix): $p (${FC_CMD[$p]})"
        return 0
    fi
    FC_REFUSED[$p]=${FC_START[$p]}
    fc_rec refused "$FC_IDX" "$p" "${FC_CMD[$p]}" "$who" "$fix"
    [[ $FC_OWNER_SAID == *"not signalled: $who "* ]] ||
        FC_OWNER_SAID+="not signalled: $who ($fix); "
}

# REPLY = "WHO<TAB>WHAT TO DO" for refused target PID: a pod by namespace/name where the
# node's container runtime tells it (crictl), else by UID; a Slurm job with its user.
fc_owner_refusal() {
    local p=$1 id=${FC_OI[$1]:-} name=${FC_ON[$1]:-} pod=""
    case ${FC_OK[$p]:-} in
        kubernetes)
            if [[ -n $name ]] && command -v crictl >/dev/null 2>&1; then
                pod=$(timeout 5 crictl inspect -o go-template --template \
                    '{{index .status.labels "io.kubernetes.pod.namespace"}}/{{index .status.labels "io.kubernetes.pod.name"}}' \
                    "$name" 2>/dev/null)
            fi
            if [[ $pod =~ ^([^/[:space:]]+)/([^/[:space:]]+)$ ]]; then
                REPLY="pod $pod"$'\t'"kubectl delete pod -n ${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
            else
                REPLY="pod with UID ${id:-unknown}"$'\t'"kubectl delete pod: the pod with UID ${id:-unknown}"
            fi
            ;;
        slurm)
            fc_owner_user "$p"
            REPLY="Slurm job $id (user $REPLY)"$'\t'"scancel $id"
            ;;
        systemd)
            fc_owner_systemctl "$id"
            REPLY="unit ${id##*/}"$'\t'"${FC_SYSTEMCTL[*]} stop ${id##*/}"
            ;;
        docker)
            fc_owner_docker "$id"
            fc_docker_words "$id"
            REPLY="${REPLY/#docker/docker container}"
            local ctr=$REPLY root pid
            # Started by docker exec: its exec session, root first, is what to end (the
            # container's main process and the rest of it are not the job's).
            if [[ -n ${FC_OWNER_EXEC[$p]:-} ]] && fc_exec_root "$p" && root=$REPLY &&
                fc_exec_tree "$root" "$p"; then
                local -a rest=()
                for pid in "${FC_TREE[@]}"; do
                    [[ $pid == "$root" ]] || rest+=("$pid")
                done
                ((${#rest[@]})) && mapfile -t rest < <(printf '%s\n' "${rest[@]}" | sort -n)
                REPLY="docker exec session $root (${FC_COMM[$root]:-?}) in $ctr"$'\t'
                # A root that ignores TERM (an interactive bash) ends by KILL only.
                if fc_ignores "$root" TERM; then
                    REPLY+="kill -KILL $root${rest[*]:+; kill ${rest[*]}}"
                else
                    REPLY+="kill $root${rest[*]:+ ${rest[*]}}"
                fi
            else
                REPLY="$ctr"$'\t'"${FC_DOCKER[*]} stop ${id:0:12}"
            fi
            ;;
        podman)
            fc_podman_ref "$p"
            fc_owner_podman "$REPLY"
            fc_podman_words "$REPLY"
            REPLY="${REPLY/#podman/podman container}"$'\t'"${FC_PODMAN[*]} stop ${id:0:12}"
            ;;
        tmux) REPLY="tmux session $name"$'\t'"tmux kill-session -t '$name'" ;;
        screen) REPLY="screen session $name"$'\t'"screen -S $name -X quit" ;;
        *) REPLY="its owner"$'\t'"stop it by hand" ;;
    esac
}

# REPLY: the user name of PID's effective uid (its status file), or "?".
fc_owner_user() {
    fc_owner_euid "$1" || { REPLY="?"; return 0; }
    fc_user_name "$REPLY"
}

# REPLY: PID's effective uid, from its status file; false (REPLY empty) where it is gone.
fc_owner_euid() {
    fc_proc_uids "$1"
    REPLY=${FC_UIDS[1]:-}
    [[ -n $REPLY ]]
}

# REPLY: ", owner KIND NAME" for target PID (empty for a plain one), for --check's lines.
fc_owner_words() {
    local kind=${FC_OK[$1]:-plain} id=${FC_OI[$1]:-} name=${FC_ON[$1]:-}
    case $kind in
        plain) REPLY="" ;;
        docker)
            fc_docker_words "$id"
            REPLY=", owner $REPLY"
            [[ -n ${FC_OWNER_EXEC[$1]:-} ]] &&
                REPLY+=" (started by docker exec, not its main process ${FC_OWNER_EXEC[$1]%% *})"
            ;;
        podman)
            fc_podman_ref "$1"
            fc_podman_words "$REPLY"
            REPLY=", owner $REPLY"
            [[ -n ${FC_OWNER_EXEC[$1]:-} ]] &&
                REPLY+=" (started by podman exec, not its main process ${FC_OWNER_EXEC[$1]%% *})"
            ;;
        kubernetes) REPLY=", owner kubernetes pod ${id:-?}" ;;
        slurm) REPLY=", owner slurm job ${name:-$id}" ;;
        *) REPLY=", owner $kind ${name:-$id}" ;;
    esac
}

# One "warn" record, once per text: something a person should know (an owner that may
# start again what was signalled).
declare -gA FC_OWNER_WARNED=()
fc_owner_warn() {
    [[ -n ${FC_OWNER_WARNED[$1]:-} ]] && return 0
    FC_OWNER_WARNED[$1]=1
    fc_rec warn "$FC_IDX" "$1"
}

# fc_owner_may_restart PID PARENT: true when something may start signalled GPU holder
# PID again, so that the verification waits out its settle and watches: for a process a
# supervisor runs (a unit, a container, a pod, a job), always, its owner being watched;
# for any other, a parent that lives on, but not PID 1: as init, PID 1 reaps an orphan
# and never restarts it; nor the containerd-shim of a process `docker exec` started.
# (A unit or container stopped through its owner is not signalled, so never asked about.)
fc_owner_may_restart() {
    local kind=${FC_OK[$1]:-plain} id=${FC_OI[$1]:-}
    [[ $kind == docker || $kind == podman ]] && fc_owner_exec_asked "$1"
    [[ $kind == podman ]] && fc_podman_ref "$1" && id=$REPLY
    if [[ -n ${FC_OWNER_EXEC[$1]:-} ]]; then
        # Started by docker exec: neither docker nor the shim, its parent, starts it again
        # (a shell that docker exec ran, running it in a loop, may: a parent as any other,
        # unless it is the root of an exec session this stage ends: fc_exec_sessions).
        # By podman exec: nor its exec session's own conmon, its parent; a new process
        # elsewhere in the container (a healthcheck's exec, a worker the main process
        # forks) is none of its doing, so the container is not watched.
        [[ $2 != 1 && $2 != "${FC_OWNER_EXEC[$1]#* }" &&
            " ${FC_EXEC_FIRST[*]} " != *" $2 "* ]]
        return
    fi
    case $kind in
        plain | tmux | screen) [[ $2 != 1 ]] ;;
        *)
            # A supervisor may start it again anywhere in its unit or container: docker
            # and the kubelet under a new containerd-shim, so its parent is no sign.
            FC_WATCH_OWNER[$kind $id]=1
            return 0
            ;;
    esac
}

# True (REPLY names it) when a process that did not exist before the signals runs in a
# unit, container or pod whose GPU holder was signalled (fc_owner_may_restart): its owner
# is starting it again. Reads the table fc_respawned scanned.
declare -gA FC_WATCH_OWNER=()
fc_owner_respawned() {
    local q
    ((${#FC_WATCH_OWNER[@]})) || return 1
    for q in "${FC_PIDS[@]}"; do
        [[ ${FC_BEFORE[$q]:-} == "${FC_START[$q]}" || ${FC_STATE[$q]} == [ZX] ]] && continue
        fc_protected "$q" && continue
        fc_owner "$q"
        fc_owner_key
        [[ -n ${FC_WATCH_OWNER[$FC_OWNER_KIND $REPLY]:-} ]] || continue
        FC_OK[$q]=$FC_OWNER_KIND FC_OI[$q]=$FC_OWNER_ID FC_ON[$q]=$FC_OWNER_NAME
        FC_OU[$q]=$FC_OWNER_UID
        fc_owner_words "$q"
        REPLY="pid $q (${FC_CMD[$q]}) started again by its owner (${REPLY#, owner })"
        return 0
    done
    return 1
}

# After the caller's signals: the stops' signals and survivors join theirs.
fc_owner_merge() {
    FC_SIGNALLED=$((FC_SIGNALLED + FC_OWNER_SENT))
    FC_LEFT+=("${FC_OWNER_LEFT[@]}")
    FC_REMAINING=${#FC_LEFT[@]}
}
