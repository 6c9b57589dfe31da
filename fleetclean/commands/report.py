"""``fleetclean report FILE...``: what a fan-out tool (clush, pdsh, srun) or an epilog printed
-> the table, ``--json`` and exit status an SSH run would give."""

from __future__ import annotations

import argparse
import sys
from urllib.parse import unquote

from fleetclean.commands.env import Env
from fleetclean.commands.output import after_emit, check_prom, emit, write_prom
from fleetclean.errors import UsageError
from fleetclean.models import HostResult, HostStatus, RunResult
from fleetclean.results import saved


def cmd_report(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    check_prom(args)
    outputs: dict[str, saved.HostOutput] = {}
    for name in args.files:
        text = _read(name)
        source = saved.detect(text) if args.source == "auto" else args.source
        for out in saved.split(text, source):
            outputs[out.host] = out  # a later file's run of a host wins
    if not outputs:
        raise UsageError(f"no host's output in {' '.join(args.files)}",
                         hint="save both streams of the tool: ... > out.txt 2>&1")
    result = saved_result(list(outputs.values()))
    write_prom(result, args, env)
    emit(result, args, env)
    # A --check run lists what it would have done; a read-only playbook with no stage
    # (status) has nothing to list, as `fleetclean status` prints none.
    if (any(_checked(o) for o in outputs.values()) and any(h.stages for h in result.hosts)
            and not (args.json or args.csv)):
        from fleetclean.results import table

        with after_emit(env):
            table.print_check(env.console(), result)
    return int(result.exit_status)


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"{name}: cannot read: {exc.strerror}",
                         hint="give the file the tool's output was saved to, or -") from None


def saved_result(outputs: list[saved.HostOutput]) -> RunResult:
    """Each host's result as the controller would decide it from the same records."""
    from fleetclean import fleet
    from fleetclean.transport import ScriptOutput

    hosts: list[HostResult] = []
    spans: list[tuple[float, float]] = []
    playbook = ""
    for out in outputs:
        if not out.records:
            status, message = saved.failure(out.notes)
            hosts.append(HostResult(out.host, HostStatus(status), message))
            continue
        span = saved.clock(out.records)
        if span is not None:
            spans.append(span)
        playbook = playbook or _playbook(out.records[0])
        stdout = "\n".join(out.records) + "\n"
        hosts.append(fleet.host_result(out.host, ScriptOutput(stdout, started=True),
                                       span[1] - span[0] if span else 0.0))
    duration = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else max(
        (h.duration_s for h in hosts), default=0.0)
    return RunResult(playbook=playbook or "?", duration_s=round(duration, 3), hosts=tuple(hosts))


def _playbook(begin: str) -> str:
    fields = begin.split("\t")
    return unquote(fields[3]) if fields[1:2] == ["begin"] and len(fields) > 3 else ""


def _checked(out: saved.HostOutput) -> bool:
    fields = out.records[0].split("\t") if out.records else []
    return fields[1:2] == ["begin"] and fields[-1] == "1"
