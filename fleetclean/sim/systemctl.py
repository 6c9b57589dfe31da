"""``systemctl`` on a simulated node: the subset fleetclean uses, as systemctl(1) prints it.

Runs inside a node (installed as ``/usr/local/sbin/systemctl``; standard library only) and
talks to the node's service manager (``svcmgr.py``). Commands: ``start``, ``stop``,
``restart``, ``is-active``, ``show`` (``-p``/``--property`` repeatable or comma-separated,
``--value``), ``daemon-reload``; ``--user`` with ``-M UID@``/``--machine=UID@.host`` (or
``XDG_RUNTIME_DIR=/run/user/UID``), ``--no-block``, ``-q``. Exit statuses as systemctl's:
3 for a unit that is not active (is-active), 5 for a unit that is not loaded, 1 when the
manager is not there (a node that never ran a unit, as a container without systemd).

>>> args = parse_args(["show", "-p", "MainPID,ActiveState", "--value", "vllm"])
>>> args.command, args.units, args.props, args.value
('show', ['vllm.service'], ['MainPID', 'ActiveState'], True)
>>> show_lines([["MainPID", "41"], ["Result", "success"], ["ActiveState", "active"]],
...            ["ActiveState", "MainPID"], value=False)
['MainPID=41', 'ActiveState=active']
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

if __package__:
    from fleetclean.sim import daemonkit
    from fleetclean.sim.svcmgr import SOCKET
else:  # run as a script: the sibling modules are found through sys.path[0]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    from svcmgr import SOCKET  # type: ignore[import-not-found,no-redef]

NO_MANAGER = (
    "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
    "Failed to connect to bus: Host is down"
)
NO_USER_BUS = (
    "Failed to connect to bus: $DBUS_SESSION_BUS_ADDRESS and $XDG_RUNTIME_DIR not defined "
    "(consider using --machine=<user>@.host --user to connect to bus of other user)"
)
SUFFIXES = (".service", ".scope", ".slice", ".socket", ".target", ".timer", ".mount")


def unit_name(word: str) -> str:
    """``vllm`` -> ``vllm.service``, as systemctl mangles a name without a type suffix."""
    return word if word.endswith(SUFFIXES) else word + ".service"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="systemctl", add_help=True)
    parser.add_argument("--user", action="store_true")
    parser.add_argument("--system", action="store_true")
    parser.add_argument("-M", "--machine", default="")
    parser.add_argument("-p", "--property", action="append", default=[])
    parser.add_argument("--value", action="store_true")
    parser.add_argument("--no-block", action="store_true")
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("--no-pager", action="store_true")
    parser.add_argument("command")
    parser.add_argument("units", nargs="*")
    args = parser.parse_intermixed_args(argv)
    args.units = [unit_name(u) for u in args.units]
    args.props = [p for group in args.property for p in group.split(",") if p]
    return args


def user_uid(args: argparse.Namespace) -> int | None:
    """The user whose manager ``--user`` means; None for the system manager. ValueError
    when --user names nobody."""
    if not args.user:
        return None
    machine = args.machine.split("@")[0] if "@" in args.machine else ""
    if machine.isdigit():
        return int(machine)
    if machine:
        import pwd

        return pwd.getpwnam(machine).pw_uid
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/run/user/") and runtime[10:].isdigit():
        return int(runtime[10:])
    raise ValueError(NO_USER_BUS)


def show_lines(props: list[list[str]], wanted: list[str], value: bool) -> list[str]:
    """systemctl show's lines: every property in the manager's order, or those asked for
    (in the manager's order, not the order asked)."""
    keep = [p for p in props if not wanted or p[0] in wanted]
    return [v if value else f"{k}={v}" for k, v in keep]


def _request(op: str, unit: str, uid: int | None, **extra: Any) -> dict[str, Any]:
    return daemonkit.call(SOCKET, {"op": op, "unit": unit, "uid": uid, **extra})


def run(args: argparse.Namespace, uid: int | None) -> int:
    command = args.command
    if command == "daemon-reload":
        _request("daemon-reload", "", uid)
        return 0
    if command == "show":
        blocks = ["\n".join(show_lines(_request("show", u, uid)["props"], args.props,
                                       args.value)) for u in args.units]
        print("\n\n".join(blocks))
        return 0
    if command == "is-active":
        return _is_active(args, uid)
    if command in ("start", "stop", "restart"):
        return _job(args, uid)
    print(f"Unknown command verb {command}.", file=sys.stderr)
    return 1


def _is_active(args: argparse.Namespace, uid: int | None) -> int:
    rc = 3
    for unit in args.units:
        props = dict(_request("show", unit, uid)["props"])
        state = props["ActiveState"]
        if not args.quiet:
            print(state)
        if state in ("active", "reloading"):
            rc = 0
    return rc


def _job(args: argparse.Namespace, uid: int | None) -> int:
    verbs = ["stop", "start"] if args.command == "restart" else [args.command]
    for unit in args.units:
        for verb in verbs:
            answer = _request(verb, unit, uid, block=not args.no_block)
            if "error" in answer:
                if "job" in answer:
                    print(f"Job for {unit} {answer['job']}.", file=sys.stderr)
                else:
                    print(f"Failed to {verb} {unit}: {answer['error']}", file=sys.stderr)
                return int(answer.get("code", 1))
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        uid = user_uid(args)
    except (ValueError, KeyError) as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        return run(args, uid)
    except daemonkit.Unavailable:
        print(NO_MANAGER, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
