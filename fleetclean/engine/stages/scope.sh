# shellcheck shell=bash disable=SC2034,SC2154
# (FC_SCOPE_* are assigned by the rendered script around this template.)
# The scope of a run on a shared node. With FC_SCOPED set, fc_protected asks
# fc_out_of_scope about every process a stage would signal:
#   FC_SCOPE_USER  --user: a name or a UID; only that user's processes are signalled;
#   FC_SCOPE_JOB   an epilog's Slurm job (SLURM_JOB_ID): the processes of any *other* job
#                  are never touched (its own leftovers are the slurm-job stage's targets).

declare -gA FC_UID_OF=() FC_JOB_OF=()
FC_SCOPE_UID=""

# Resolve the scope on this host and say it in a "scope" record; a user this host does not
# know halts the stages (nothing can be that user's).
fc_scope_begin() {
    FC_SCOPED=1
    if [[ $FC_SCOPE_USER =~ ^[0-9]+$ ]]; then
        FC_SCOPE_UID=$FC_SCOPE_USER
    elif [[ -n $FC_SCOPE_USER ]] && ! FC_SCOPE_UID=$(id -u -- "$FC_SCOPE_USER" 2>/dev/null); then
        FC_SCOPE_UID=""
        FC_HALT=1
        FC_HALT_REASON="no user $FC_SCOPE_USER on this host"
        fc_rec error "--user $FC_SCOPE_USER: no such user on this host"
    fi
    fc_rec scope "$FC_SCOPE_USER" "$FC_SCOPE_UID" "$FC_SCOPE_JOB"
}

# REPLY: why PID is outside the scope, or "" when it is inside.
fc_out_of_scope() {
    local pid=$1
    if [[ -n $FC_SCOPE_USER ]]; then
        fc_uid_of "$pid"
        if [[ -z $FC_SCOPE_UID || $REPLY != "$FC_SCOPE_UID" ]]; then
            REPLY="not user $FC_SCOPE_USER's"
            return 0
        fi
    fi
    if [[ -n $FC_SCOPE_JOB ]]; then
        fc_job_of "$pid"
        if [[ -n $REPLY && $REPLY != "$FC_SCOPE_JOB" ]]; then
            REPLY="belongs to Slurm job $REPLY"
            return 0
        fi
    fi
    REPLY=""
}

# REPLY: the real UID of PID ("" when it is gone), read once per process.
fc_uid_of() {
    local pid=$1 key k uid
    key="$pid:${FC_START[$pid]:-}"
    if [[ -n ${FC_UID_OF[$key]+set} ]]; then
        REPLY=${FC_UID_OF[$key]}
        return 0
    fi
    REPLY=""
    while IFS=$'\t' read -r k uid _; do
        if [[ $k == Uid: ]]; then
            REPLY=$uid
            break
        fi
    done <"/proc/$pid/status" 2>/dev/null
    FC_UID_OF[$key]=$REPLY
}

# REPLY: the Slurm job PID belongs to ("" for none), read once per process: its cgroup
# (proctrack/cgroup: .../job_N/...), else a slurmstepd ancestor ("slurmstepd: [N.S]"), else
# the SLURM_JOB_ID it inherited (an orphan reparented away from its step keeps that one).
fc_job_of() {
    local pid=$1 key line p hops=0 step='^slurmstepd: \[([0-9]+)\.'
    local -a env=()
    key="$pid:${FC_START[$pid]:-}"
    if [[ -n ${FC_JOB_OF[$key]+set} ]]; then
        REPLY=${FC_JOB_OF[$key]}
        return 0
    fi
    REPLY=""
    while IFS= read -r line; do
        if [[ $line =~ /job_([0-9]+)(/|$) ]]; then
            REPLY=${BASH_REMATCH[1]}
            break
        fi
    done <"/proc/$pid/cgroup" 2>/dev/null
    p=$pid
    while [[ -z $REPLY && -n $p && $p != 0 && $p != 1 ]] && ((hops++ < 64)); do
        [[ ${FC_CMD[$p]:-} =~ $step ]] && REPLY=${BASH_REMATCH[1]}
        p=${FC_PPID[$p]:-}
    done
    if [[ -z $REPLY ]]; then
        { mapfile -d '' -t env <"/proc/$pid/environ"; } 2>/dev/null || :
        for line in "${env[@]}"; do
            if [[ $line == SLURM_JOB_ID=* ]]; then
                REPLY=${line#SLURM_JOB_ID=}
                break
            fi
        done
    fi
    FC_JOB_OF[$key]=$REPLY
}
