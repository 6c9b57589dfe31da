# shellcheck shell=bash disable=SC2034
# fleetclean owner attribution: who runs a process, from /proc/PID/cgroup and its ancestors.
#
# fc_owner PID sets FC_OWNER_KIND, FC_OWNER_ID and FC_OWNER_NAME:
#
#   kind        id                                  name
#   systemd     unit (vllm.service); a user unit:   the unit (jupyter.service)
#               user@1000.service/jupyter.service
#   docker      container id (64 hex)               its short form (12 hex); one under
#                                                   user@UID.service is rootless Docker's,
#                                                   that user's daemon's: FC_DOCKER_UID[id]
#   podman      container id (64 hex)               its short form (12 hex); one under
#                                                   user.slice/user-UID.slice/
#                                                   user@UID.service is that user's
#                                                   (rootless): FC_OWNER_UID (FC_OU[pid])
#   kubernetes  pod UID (or empty)                  container id (64 hex, or empty)
#   slurm       job id (4242)                       job.step (4242.0, 4242.batch)
#   tmux        the tmux server's pid               the session ($0, from $TMUX)
#   screen      the SCREEN process's pid            the session (12345.train, from $STY)
#   plain       (empty)                             (empty)
#
# From the cgroup (cgroup v2 "0::/..." and v1 "N:controllers:/..." lines): the innermost
# recognised component of a path wins, except that any kubepods component makes it
# Kubernetes, and a Podman container below a unit's own cgroup (Quadlet's --cgroups=split)
# is the unit's; components above the node's own root (the parent of PID 1's cgroup, e.g.
# LXD's /lxc.payload.NAME) are ignored. On v1 the controller lines decide for containers,
# pods and jobs (with the cgroupfs driver, name=systemd and cgroup2 may still name the
# service that started them), then cgroup2, then name=systemd. A container, pod or job
# wins; else an ancestor "slurmstepd: [J.S]", "tmux: server" or SCREEN (the innermost); else
# a systemd unit; else plain. A Podman container outside a unit's cgroup is `podman` here,
# wherever its conmon runs: podman leaves conmon in its caller's cgroup whenever
# INVOCATION_ID is set (any unit's process: podman-restart.service, which starts every
# --restart=always container at boot), so that cgroup names no owner; the unit that runs
# it (PODMAN_SYSTEMD_UNIT, a label of the container's) is read with podman's answer
# (owner-act.sh, fc_podman_inspect). A process that the cgroup leaves plain or in slurmd's own
# unit, whose SLURM_JOB_ID names a job that still runs on the node (a live slurmstepd), is
# that job's (slurm): a worker that left its job's cgroup and slurmstepd's tree.
#
# Cheap: reads /proc/PID/cgroup, /proc/1/cgroup once, /proc/PID/environ (tmux, screen,
# SLURM_JOB_ID), and the process table fc_scan filled (FC_PPID, FC_COMM, FC_CMD, FC_ARGV0);
# builtins only, except one pgrep a job named by a process's SLURM_JOB_ID outside its job's
# cgroup. ${FC_PROC:-/proc} lets tests read captured texts.

# FC_OK/FC_OI/FC_ON[pid]: the kind, id and name fc_owner_prep found for pid.
declare -gA FC_CG_ROOT=() FC_OWNER_DONE=() FC_OWNER_PREP=() FC_OK=() FC_OI=() FC_ON=() FC_CG_MEMO=()
# FC_DOCKER_UID[container id]: the user whose rootless daemon runs it (its cgroup is under
# user@UID.service: .../user@UID.service/user.slice/docker-ID.scope), where one does.
declare -gA FC_DOCKER_UID=()
# FC_OU[pid]: the user whose rootless Podman runs pid's container (FC_OWNER_UID: its cgroup
# under user.slice/user-UID.slice/user@UID.service, .../user.slice/libpod-ID.scope), per
# process, never per container id: a user may name a cgroup of theirs after root's
# container's id.
declare -gA FC_OU=()
FC_OWNER_STEPDS="" # " J1 J2 ": the jobs whose slurmstepd runs here (fc_owner_job_runs)
FC_CG_ROOTS_READ=0
FC_OWNER_KIND="" FC_OWNER_ID="" FC_OWNER_NAME="" FC_OWNER_UID=""

# The node's root in each hierarchy (key "v2" for cgroup2): the parent of PID 1's cgroup,
# from FILE (default /proc/1/cgroup); "" when PID 1 sits at / or in /init.scope.
fc_owner_roots() {
    local file=${1:-${FC_PROC:-/proc}/1/cgroup} line key path
    FC_CG_ROOT=()
    FC_CG_MEMO=()  # its answers hold for these roots only
    FC_CG_ROOTS_READ=1
    [[ -r $file ]] || return 0
    while IFS= read -r line; do
        [[ $line == *:*:* ]] || continue
        key=${line#*:}
        key=${key%%:*}
        path=${line#*:*:}
        FC_CG_ROOT[${key:-v2}]=${path%/*}
    done <"$file"
}

# fc_owner_path PATH: the owner one cgroup path names, as O_KIND/O_ID/O_NAME ("" if none);
# O_UID: a rootless Podman container's user.
fc_owner_path() {
    local path=$1 c rest uid="" ctr="" kube=0 slurm=0 job="" step="" manager="" prev="" i=-1
    O_KIND="" O_ID="" O_NAME="" O_UID=""
    local -a parts=()
    IFS=/ read -r -a parts <<<"${path#/}"
    for c in "${parts[@]}"; do
        ((++i))
        if [[ $c == *kubepods* ]]; then
            # kubepods-besteffort-pod<uid>.slice (systemd driver, "_" for "-"), or the
            # ".slice:cri-containerd:<id>" form of a containerd that mixes both drivers.
            kube=1
            rest=${c%%.slice*}
            [[ $rest == *-pod* ]] && uid=${rest##*-pod} && uid=${uid//_/-}
            [[ $c == *:*:* ]] && ctr=${c##*:}
        elif ((kube)) && [[ $c =~ ^pod([0-9a-fA-F-]{32,36})$ ]]; then
            uid=${BASH_REMATCH[1]}
        elif ((kube)) && [[ $c =~ ^((cri-containerd|crio|docker)-)?([0-9a-f]{64})(\.scope)?$ ]]; then
            ctr=${BASH_REMATCH[3]}
        # Each regex behind a glob that most components fail: bash compiles a regex
        # anew at every test (a cgroup v1 file: ten lines of a few components each).
        elif [[ $c == docker-*.scope && $c =~ ^docker-([0-9a-f]{64})\.scope$ ]] ||
            [[ $prev == docker && ${#c} -eq 64 && $c =~ ^([0-9a-f]{64})$ ]]; then
            O_KIND=docker O_ID=${BASH_REMATCH[1]} O_NAME=${BASH_REMATCH[1]:0:12}
            # Only the user's manager (or root) makes cgroups under user@UID.service.
            [[ -n $manager ]] && FC_DOCKER_UID[$O_ID]=${manager//[!0-9]/}
        # Podman's container (libpod-ID.scope by the systemd manager, libpod-ID under
        # /libpod_parent by cgroupfs, libpod-payload-ID in a unit's cgroup by
        # --cgroups=split) and its conmon's (libpod-conmon-ID.scope). Under a unit's own
        # cgroup the unit stays the owner: it runs the container (Quadlet).
        elif [[ $c == libpod-* && $c =~ ^libpod-(conmon-|payload-)?([0-9a-f]{64})(\.scope)?$ ]]; then
            if [[ $O_KIND != systemd || $O_ID == "$manager" ]]; then
                O_KIND=podman O_ID=${BASH_REMATCH[2]} O_NAME=${BASH_REMATCH[2]:0:12}
                O_UID=${manager//[!0-9]/}
            fi
        elif [[ $c == slurm || $c == slurm_* || $c == *slurmstepd.scope ]]; then
            slurm=1
        elif ((slurm)) && [[ $c =~ ^job_([0-9]+)$ ]]; then
            job=${BASH_REMATCH[1]} step=""
            O_KIND=slurm O_ID=$job O_NAME=$job
        elif ((slurm)) && [[ -n $job && $c =~ ^step_(.+)$ ]]; then
            step=${BASH_REMATCH[1]}
            O_NAME=$job.$step
        # A user's manager is user.slice/user-UID.slice/user@UID.service, the one place
        # logind and systemd make it (below, the user's delegated subtree: any name the
        # user likes, user@0.service too, is a unit of theirs).
        elif ((i == 2)) && [[ $c == user@*.service && $c =~ ^user@([0-9]+)\.service$ &&
            ${parts[0]} == user.slice && ${parts[1]} == "user-${BASH_REMATCH[1]}.slice" ]]; then
            manager=$c
            O_KIND=systemd O_ID=$c O_NAME=$c
        elif [[ $c == ?*.service ]]; then
            O_KIND=systemd O_ID=${manager:+$manager/}$c O_NAME=$c
        fi
        prev=$c
    done
    if ((kube)); then
        O_KIND=kubernetes O_ID=$uid O_NAME=$ctr
    fi
}

# fc_owner_cgroup FILE: the owner a /proc/PID/cgroup text names (see the rules above);
# sets FC_OWNER_*; kind "" when the cgroups name none. Worked out once per text: the eight
# workers of a server share their cgroups, and the rules cost a regex per path component.
fc_owner_cgroup() {
    local -a lines=()
    local text
    ((FC_CG_ROOTS_READ)) || fc_owner_roots
    FC_OWNER_KIND="" FC_OWNER_ID="" FC_OWNER_NAME="" FC_OWNER_UID=""
    { mapfile -t lines <"$1"; } 2>/dev/null || return 0
    printf -v text '%s\n' "${lines[@]}"
    if [[ -z ${FC_CG_MEMO[$text]+set} ]]; then
        fc_owner_cgroup_rules "${lines[@]}"
        FC_CG_MEMO[$text]="$FC_OWNER_KIND"$'\n'"$FC_OWNER_ID"$'\n'"$FC_OWNER_UID"$'\n'"$FC_OWNER_NAME"
    fi
    text=${FC_CG_MEMO[$text]}
    FC_OWNER_KIND=${text%%$'\n'*}
    text=${text#*$'\n'}
    FC_OWNER_ID=${text%%$'\n'*}
    text=${text#*$'\n'}
    FC_OWNER_UID=${text%%$'\n'*}
    FC_OWNER_NAME=${text#*$'\n'}
}

# fc_owner_cgroup_rules LINE...: fc_owner_cgroup's rules on the lines of one cgroup file.
fc_owner_cgroup_rules() {
    local line key path root k
    local -A found_kind=() found_id=() found_name=() found_uid=()
    for line in "$@"; do
        [[ $line == *:*:* ]] || continue
        key=${line#*:}
        key=${key%%:*}
        path=${line#*:*:}
        root=${FC_CG_ROOT[${key:-v2}]:-}
        if [[ -n $root && ($path == "$root" || $path == "$root"/*) ]]; then
            path=${path#"$root"}
        fi
        fc_owner_path "$path"
        [[ -n $O_KIND ]] || continue
        case $key in
            "") k=v2 ;;
            name=systemd) k=systemd ;;
            name=*) continue ;;
            *) k=controller ;;
        esac
        # Controllers speak for containers, pods and jobs only: with task/cgroup, Slurm
        # moves a task into cpuset and memory while devices still reads slurmd.service.
        [[ $k == controller && $O_KIND == systemd ]] && continue
        # The first controller line that names something is the controllers' word.
        [[ -n ${found_kind[$k]:-} ]] && continue
        found_kind[$k]=$O_KIND found_id[$k]=$O_ID found_name[$k]=$O_NAME found_uid[$k]=$O_UID
    done
    for k in controller v2 systemd; do
        case ${found_kind[$k]:-} in
            docker | podman | kubernetes | slurm)
                FC_OWNER_KIND=${found_kind[$k]} FC_OWNER_ID=${found_id[$k]}
                FC_OWNER_NAME=${found_name[$k]} FC_OWNER_UID=${found_uid[$k]}
                return 0
                ;;
        esac
    done
    for k in systemd v2; do
        if [[ ${found_kind[$k]:-} == systemd ]]; then
            FC_OWNER_KIND=systemd FC_OWNER_ID=${found_id[$k]} FC_OWNER_NAME=${found_name[$k]}
            return 0
        fi
    done
}

# fc_owner_ancestry PID: the innermost ancestor that is a slurmstepd, a tmux server or a
# SCREEN, from the process table; sets FC_OWNER_* and succeeds, or fails.
fc_owner_ancestry() {
    local pid=$1 p=${FC_PPID[$1]:-0} n=0 base
    while [[ -n $p && $p != 0 && $p != 1 ]] && ((n++ < 64)); do
        # The verification loads only the processes it names: their ancestors, here.
        [[ -n ${FC_CMD[$p]+set} ]] || fc_proc_load "$p" || break
        if [[ ${FC_CMD[$p]:-} == "slurmstepd: ["* &&
            ${FC_CMD[$p]} =~ ^slurmstepd:\ \[([0-9]+)(\+[0-9]+)?\.([^]]+)\] ]]; then
            FC_OWNER_KIND=slurm FC_OWNER_ID=${BASH_REMATCH[1]}
            FC_OWNER_NAME=${BASH_REMATCH[1]}.${BASH_REMATCH[3]}
            return 0
        fi
        base=${FC_ARGV0[$p]:-}
        base=${base##*/}
        if [[ ${FC_COMM[$p]:-} == "tmux: server" ]]; then
            fc_owner_env "$pid" TMUX
            REPLY=${REPLY##*,}
            FC_OWNER_KIND=tmux FC_OWNER_ID=$p FC_OWNER_NAME=${REPLY:+\$$REPLY}
            return 0
        fi
        if [[ $base == SCREEN ]]; then
            fc_owner_env "$pid" STY
            FC_OWNER_KIND=screen FC_OWNER_ID=$p FC_OWNER_NAME=$REPLY
            return 0
        fi
        p=${FC_PPID[$p]:-0}
    done
    return 1
}

# fc_owner_env PID NAME: REPLY = the value of NAME in PID's environment ("" if none).
fc_owner_env() {
    local -a env=()
    local e
    REPLY=""
    { mapfile -d '' -t env <"${FC_PROC:-/proc}/${FC_LIVE_DIR[$1]:-$1}/environ"; } 2>/dev/null ||
        return 0
    for e in "${env[@]}"; do
        if [[ $e == "$2="* ]]; then
            REPLY=${e#*=}
            return 0
        fi
    done
}

# fc_owner PID: the owner of PID; FC_OWNER_KIND is never empty ("plain" at worst).
fc_owner() {
    local pid=$1 kind id name
    fc_owner_cgroup "${FC_PROC:-/proc}/$pid/cgroup"
    case $FC_OWNER_KIND in
        docker | kubernetes | slurm | podman) return 0 ;;
    esac
    FC_OWNER_UID=""
    kind=$FC_OWNER_KIND id=$FC_OWNER_ID name=$FC_OWNER_NAME
    fc_owner_ancestry "$pid" && return 0
    # A job's process outside its job's cgroup and slurmstepd's tree (proctrack/linuxproc
    # or pgid without task/cgroup, a daemon that double-forked: cgroup slurmd.service or
    # none, parent 1) is still the job's while the job runs. After the job, it is a stray.
    # Its environment is read only there (0.5 ms a process).
    if [[ -z $kind || $kind == plain || ($kind == systemd && $id == slurmd*) ]]; then
        fc_owner_env "$pid" SLURM_JOB_ID
        if [[ $REPLY =~ ^[0-9]+$ ]] && fc_owner_job_runs "$REPLY"; then
            FC_OWNER_KIND=slurm FC_OWNER_ID=$REPLY FC_OWNER_NAME=$REPLY
            return 0
        fi
    fi
    FC_OWNER_KIND=${kind:-plain} FC_OWNER_ID=$id FC_OWNER_NAME=$name
}

# fc_owner_job_runs JOB: true while a slurmstepd of Slurm job JOB runs on this node. The
# slurmstepds are found by their name (root's processes named slurmstepd: pgrep reads
# stat, never a command line, which a process stuck in the kernel can hang; a user's
# `exec -a "slurmstepd: [J.0]"` is not root's), then their titles read, once a script.
# Without pgrep, /proc/PID/comm of every process, with builtins.
fc_owner_job_runs() {
    local p title comm
    if [[ -z $FC_OWNER_STEPDS ]]; then
        FC_OWNER_STEPDS=" "
        local -a pids=()
        if command -v pgrep >/dev/null 2>&1; then
            mapfile -t pids < <(pgrep -u 0 -x slurmstepd 2>/dev/null)
        else
            for p in /proc/[0-9]*; do
                { read -r comm <"$p/comm"; } 2>/dev/null || continue
                [[ $comm == slurmstepd ]] && pids+=("${p#/proc/}")
            done
        fi
        for p in "${pids[@]}"; do
            title=""
            { IFS= read -r -d '' title <"/proc/$p/cmdline"; } 2>/dev/null
            [[ $title =~ ^slurmstepd:\ \[([0-9]+)[].+] ]] &&
                FC_OWNER_STEPDS+="${BASH_REMATCH[1]} "
        done
    fi
    [[ $FC_OWNER_STEPDS == *" $1 "* ]]
}

# One "owner" record per PID for the processes a stage matches or signals, and those the
# verification names, the first time.
fc_owner_records() {
    local p
    for p in "$@"; do
        [[ -n ${FC_OWNER_DONE[$p]:-} ]] && continue
        FC_OWNER_DONE[$p]=1
        [[ -n ${FC_OWNER_PREP[$p]:-} ]] || fc_owner_prep "$p"
        fc_rec owner "$p" "${FC_OK[$p]}" "${FC_OI[$p]}" "${FC_ON[$p]}"
    done
}

# FC_OK/FC_OI/FC_ON[PID]: the owner of PID, worked out once, before its record (a status
# reads the processes its host's last status named while its GPU read runs: verify.sh).
fc_owner_prep() {
    FC_OWNER_PREP[$1]=1
    fc_owner "$1"
    FC_OK[$1]=$FC_OWNER_KIND FC_OI[$1]=$FC_OWNER_ID FC_ON[$1]=$FC_OWNER_NAME
    FC_OU[$1]=$FC_OWNER_UID
}
