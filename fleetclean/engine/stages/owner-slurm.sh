# shellcheck shell=bash disable=SC2034
# fleetclean: a Slurm job stopped through Slurm (owner_slurm: stop; owner-act.sh calls these).
# Carried only by the scripts of a playbook whose owner_slurm is stop (render.library): an
# epilog, which slurmd runs while slurmctld waits on it, must call no Slurm command, and
# forces owner_slurm to signal (export.render_epilog).

# True where this node has the Slurm client to cancel job $1 with: its own scancel and
# slurm.conf (where slurmd reads it); root may cancel any job, a user their own, and a
# refusal is said when scancel runs. Else a warning, and its processes are signalled.
fc_slurm_can_cancel() {
    command -v scancel >/dev/null 2>&1 && return 0
    fc_owner_warn "no scancel on the node: Slurm job $1's processes were signalled; the job may start more; to end it: scancel $1"
    return 1
}

# fc_slurm_how JOB PID: how target PID's job JOB is cancelled: FC_SLURM_REF, the job as
# scancel is given it, and FC_SLURM_AS, the words that run scancel as PID's own user.
# - An array task's own id (ARRAY_TASK, from its SLURM_ARRAY_JOB_ID and
#   SLURM_ARRAY_TASK_ID): one task of every array has the array's id for its job id, and
#   `scancel ID` of it ends every task of the array, pending ones too.
# - As the process's user (runuser, as fc_as_user: none of root's environment), so that
#   slurmctld lets it cancel only what that user may: the job id comes from the process's
#   cgroup, environment or ancestors' titles, which a user can forge for a process of
#   theirs; cancelled by root, it would end anyone's job, on every node it runs on.
# False, REPLY saying why, where this login cannot run scancel as that user.
declare -gA FC_SLURM_DONE=()
fc_slurm_how() {
    local job=$1 pid=$2 uid array task
    FC_SLURM_REF=$job FC_SLURM_AS=()
    fc_owner_env "$pid" SLURM_JOB_ID
    if [[ $REPLY == "$job" ]]; then
        fc_owner_env "$pid" SLURM_ARRAY_JOB_ID
        array=$REPLY
        fc_owner_env "$pid" SLURM_ARRAY_TASK_ID
        task=$REPLY
        [[ $array == +([0-9]) && $task == +([0-9]) ]] && FC_SLURM_REF=${array}_$task
    fi
    FC_SLURM_DONE[$job]=$FC_SLURM_REF
    if ! fc_owner_euid "$pid"; then
        REPLY="pid $pid is gone"
        return 1
    fi
    uid=$REPLY
    ((uid == 0 || uid == EUID)) && return 0
    fc_as_user "$uid" scancel || return 1
    FC_SLURM_AS=("${FC_AS[@]}")
}

# fc_slurm_cancel: `scancel FC_SLURM_REF` as FC_SLURM_AS (fc_slurm_how), 10 s at most where
# timeout(1) is there; fails, with scancel's words on standard output, where it did not
# cancel the job. scancel exits 0 for a job it could not signal on some versions, saying so
# on standard error: that is a failure too.
fc_slurm_cancel() {
    local out rc=0
    if command -v timeout >/dev/null 2>&1; then
        out=$(timeout -k 1 10 "${FC_SLURM_AS[@]}" scancel "$FC_SLURM_REF" 2>&1 </dev/null) ||
            rc=$?
    else
        out=$("${FC_SLURM_AS[@]}" scancel "$FC_SLURM_REF" 2>&1 </dev/null) || rc=$?
    fi
    ((rc == 124 || rc == 137)) && out="no answer from slurmctld in 10 s"
    printf '%s' "${out:-exit $rc}"
    ((rc == 0)) && [[ $out != *error* ]]
}
