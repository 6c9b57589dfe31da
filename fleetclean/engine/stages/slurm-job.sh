# shellcheck shell=bash disable=SC2034,SC2154
# (opt_* are assigned, and FC_* read, by the rendered script around this template.)
# Stage "slurm-job": what a finished Slurm job left on this node, the first stage of an
# epilog. Every process attributed to job FC_SCOPE_JOB (SLURM_JOB_ID: see fc_job_of in
# scope.sh), with its tree, is signalled and escalated as a signal stage does; with
# proctrack/linuxproc, a worker that its job's step lost track of (reparented away) is
# still running here after the job ended. Nothing to do outside a Slurm job.
# Options: opt_signal, opt_grace_ms, opt_kill_wait_ms, opt_tree (0/1).
fc_stage_slurm_job() {
    local pid
    local -a hits=()
    if [[ -z ${FC_SCOPE_JOB:-} ]]; then
        FC_MESSAGE="no Slurm job here (SLURM_JOB_ID is not set)"
        return 0
    fi
    fc_scan
    for pid in "${FC_PIDS[@]}"; do
        [[ -n ${FC_CMD[$pid]} ]] || continue
        fc_job_of "$pid"
        [[ $REPLY == "$FC_SCOPE_JOB" ]] && hits+=("$pid")
    done
    fc_signal_hits "${hits[@]}"
}
