"""``--drain-dirty`` and ``--resume-clean`` for ``run`` and ``status`` (argparse only, so
that the CLI's parser can add them without importing the commands)."""

from __future__ import annotations

import argparse
import shutil

from fleetclean.errors import UsageError


def add_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--drain-dirty", action="store_true",
                    help="drain the Slurm node of a host left faulty, or dirty while no job "
                    "runs on it (scontrol, Reason='fleetclean RUN: ...')")
    sp.add_argument("--resume-clean", action="store_true",
                    help="resume Slurm nodes that fleetclean drained and that are clean now")


def wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "drain_dirty", False) or getattr(args, "resume_clean", False))


def login_source(sources: list[str]) -> str | None:
    """The ``slurm://LOGINHOST`` source among the inventory sources, if any: where Slurm's
    commands then run.

    >>> login_source(["lab.yml", "slurm://login01"]), login_source(["slurm:"])
    ('slurm://login01', None)
    """
    return next((s for s in sources if s.startswith("slurm://")), None)


def check(args: argparse.Namespace, sources: list[str]) -> None:
    """Refuse the options before anything is sent when they cannot work here."""
    if not wanted(args):
        return
    flag = "--drain-dirty" if args.drain_dirty else "--resume-clean"
    if getattr(args, "check", False):
        raise UsageError(f"{flag} changes Slurm; --check changes nothing",
                         hint=f"drop {flag} or --check")
    if getattr(args, "watch", None) is not None:
        raise UsageError(f"{flag} does not go with --watch", hint="run status once with it")
    if login_source(sources) is None and (shutil.which("scontrol") is None
                                          or shutil.which("sinfo") is None):
        raise UsageError(f"{flag}: scontrol/sinfo not found on this machine",
                         hint="run fleetclean where Slurm's client is installed (slurm-client), "
                         "or name the login node: -i slurm://LOGINHOST")
