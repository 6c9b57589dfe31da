"""Slurm on the controller's side: node states from ``sinfo``, drain and resume through
``scontrol`` (``--drain-dirty``, ``--resume-clean``). Hosts *from* Slurm are
:mod:`fleetclean.inventory.slurm`'s job."""
