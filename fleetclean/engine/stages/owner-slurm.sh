# shellcheck shell=bash
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

# fc_slurm_cancel JOB: `scancel JOB` (10 s at most where timeout(1) is there); fails, with
# scancel's words on standard output, where it did not cancel the job. scancel exits 0 for
# a job it could not signal on some versions, saying so on standard error: that is a
# failure too.
fc_slurm_cancel() {
    local out rc=0
    if command -v timeout >/dev/null 2>&1; then
        out=$(timeout -k 1 10 scancel "$1" 2>&1 </dev/null) || rc=$?
    else
        out=$(scancel "$1" 2>&1 </dev/null) || rc=$?
    fi
    ((rc == 124 || rc == 137)) && out="no answer from slurmctld in 10 s"
    printf '%s' "${out:-exit $rc}"
    ((rc == 0)) && [[ $out != *error* ]]
}
