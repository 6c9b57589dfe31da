"""The Slurm step of ``run`` and ``status``: drain or resume nodes after the hosts ran,
before the result is recorded and printed."""

from __future__ import annotations

import argparse
import time

from fleetclean.commands.env import Env, error_line
from fleetclean.commands.steps import inventory_sources, login_runner
from fleetclean.models import RunResult
from fleetclean.results.words import printable
from fleetclean.slurm import drain, options
from fleetclean.slurm.nodes import Runner, SlurmUnavailable


def apply(result: RunResult, args: argparse.Namespace, env: Env, run_id: str | None) -> RunResult:
    """``result`` with each host's ``slurm`` record; unchanged without the options, after
    an interrupt, or (with a warning) when Slurm cannot be read."""
    if not options.wanted(args) or result.interrupted:
        return result
    rid = run_id or time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    try:
        return drain.apply(result, drain=args.drain_dirty, resume=args.resume_clean, run_id=rid,
                           runner=_runner(args, env))
    except SlurmUnavailable as exc:
        error_line(env, f"fleetclean: warning: no Slurm node drained or resumed: {exc}")
        return result


def _runner(args: argparse.Namespace, env: Env) -> Runner | None:
    """Slurm's commands on the login node of a ``slurm://LOGINHOST`` inventory; else here."""
    source = options.login_source(inventory_sources(args, env))
    if source is None:
        return None
    return login_runner(args, env, source)


def print_lines(result: RunResult, args: argparse.Namespace, env: Env) -> None:
    """Under the table: what was done to each node, and why a node was left alone."""
    if args.json or args.csv or not options.wanted(args):
        return
    for line in drain.summary_lines(result):  # a drain's reason holds a host's words
        env.console().print(printable(line), markup=False, soft_wrap=True)
