#!/bin/sh
# Slurm's TaskProlog on a simulated node with cgroup v2 (see slurm_conf.task_settings).
# slurmstepd runs it as the job's user, as a child of the task about to start; it puts the
# task, and its slurmstepd, where Slurm's cgroup/v2 plugin would:
#   /system.slice/slurmstepd.scope/job_J/step_S/user/task_T   (the task)
#   /system.slice/slurmstepd.scope/job_J/step_S/slurm         (its slurmstepd)
# A user that may not write there leaves both in slurmd's cgroup: nothing fails.
step=${SLURM_STEP_ID:-${SLURM_STEPID:-batch}}
task=${SLURM_TASK_PID:-$PPID}
root=/sys/fs/cgroup/system.slice/slurmstepd.scope/job_${SLURM_JOB_ID:?}/step_$step
mkdir -p "$root/user/task_${SLURM_LOCALID:-0}" "$root/slurm" 2>/dev/null || exit 0
read -r stat <"/proc/$task/stat" || exit 0
# shellcheck disable=SC2086 # the fields after the command name, split on purpose
set -- ${stat##*) }
echo "$2" >"$root/slurm/cgroup.procs" 2>/dev/null
echo "$task" >"$root/user/task_${SLURM_LOCALID:-0}/cgroup.procs" 2>/dev/null
exit 0
