"""Stage type ``slurm-job``: signal what a finished Slurm job left on the node.

The first stage of ``fleetclean export slurm-epilog``: every process of the job named by
the epilog's ``SLURM_JOB_ID`` (its cgroup, a ``slurmstepd: [JOB.STEP]`` ancestor, or the
``SLURM_JOB_ID`` it inherited), with its tree; outside a Slurm job it has nothing to do.

>>> from fleetclean.engine.model import ResolvedStage
>>> STAGE.assignments(ResolvedStage("job-leftovers", "slurm-job", {
...     "match": "identity", "signal": "TERM", "grace": 3.0, "kill_wait": 3.0,
...     "tree": True}))[1]
'opt_signal=TERM'
"""

from __future__ import annotations

from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import StageType, packaged
from fleetclean.engine.stages.signal import signalling_assignments, signalling_options


def _assignments(stage: ResolvedStage) -> list[str]:
    return signalling_assignments(stage.options)


STAGE = StageType(
    name="slurm-job",
    options=signalling_options(grace=3),
    assignments=_assignments,
    template=packaged("slurm-job.sh"),
    libraries=("lib-match.sh", "lib-kill.sh", "owner.sh", "owner-act.sh"),
)
