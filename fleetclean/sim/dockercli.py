"""``docker`` on a simulated node: ``ps``, ``inspect``, ``stop``, ``kill``, ``exec``, ``info``,
as the docker CLI prints them.

Runs inside a node (installed as ``/usr/local/sbin/docker`` once the node has a Docker
engine; standard library only). ``ps``: the table (``--no-trunc``, ``-a``, ``-q``,
``--format`` with docker's Go-template fields and a ``table`` prefix); ``inspect``: the JSON
array, or ``-f``/``--format``; ``stop [-t|--time GRACE]`` and ``kill [-s SIGNAL]`` print each
container named; ``exec [-d] [-i] [-e KEY[=VALUE]]... [-w DIR] CONTAINER COMMAND [ARG...]``
starts COMMAND in the container beside its main process (``containers.py``): attached, it
writes to this command's output and its exit status is the command's; with ``-d`` it
prints nothing and returns once the command runs; a command that cannot start is ``OCI
runtime exec failed: ...``, 127 (not found) or 126. Errors as the CLI's (``Error response
from daemon: No such container: x``, exit 1). Without the engine: ``Cannot connect to the
Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?``, exit 1.

The daemon, as the real CLI picks it (cli/command/cli.go, getServerHost): ``-H``/``--host
HOST`` before the command, else ``$DOCKER_HOST``, else root's, ``unix:///var/run/docker.sock``;
two ``-H``: ``Please specify only one -H``, exit 1. A user's rootless daemon is
``unix:///run/user/UID/docker.sock``; root's knows none of its containers. Only unix
sockets are simulated: any other host cannot be connected to.

>>> daemon_host(["-H", "unix:///run/user/2602/docker.sock", "ps"], {})
('unix:///run/user/2602/docker.sock', ['ps'])
>>> daemon_host(["--host=unix://", "ps"], {"DOCKER_HOST": "unix:///x.sock"})
('unix:///var/run/docker.sock', ['ps'])
>>> daemon_host(["ps", "-H"], {"DOCKER_HOST": "unix:///x.sock"})
('unix:///x.sock', ['ps', '-H'])
>>> table([["A", "LONGER"], ["xx", "y"]])
['A         LONGER', 'xx        y']
>>> short_command("python3 -m vllm.entrypoints.openai.api_server", trunc=True)
'"python3 -m vllm.ent…"'
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from typing import Any

if __package__:
    from fleetclean.sim import daemonkit, gotmpl
else:  # run as a script: the sibling modules are found through sys.path[0]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import gotmpl  # type: ignore[import-not-found,no-redef]

# Root's daemon (dockerd's /run/docker.sock: /var/run is /run on a node).
DEFAULT_HOST = "unix:///var/run/docker.sock"
NO_DAEMON = "Cannot connect to the Docker daemon at {host}. Is the docker daemon running?"
PS_COLUMNS = [("CONTAINER ID", "ID"), ("IMAGE", "Image"), ("COMMAND", "Command"),
              ("CREATED", "RunningFor"), ("STATUS", "Status"), ("PORTS", "Ports"),
              ("NAMES", "Names")]
HEADERS = {"ID": "CONTAINER ID", "RunningFor": "CREATED", "CreatedAt": "CREATED AT"}


def table(rows: list[list[str]], minwidth: int = 10, padding: int = 3) -> list[str]:
    """Go's tabwriter as the docker CLI sets it up (minimum width 10, padding 3); the last
    column is not padded. crictl's is the same with a minimum width of 20."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [c.ljust(max(minwidth, w + padding))
                 for c, w in zip(row[:-1], widths, strict=False)]
        out.append("".join(cells) + row[-1])
    return out


def short_command(command: str, trunc: bool) -> str:
    """The COMMAND cell: quoted as Go's strconv.Quote, cut to 20 characters with '…'."""
    if trunc and len(command) > 20:
        command = command[:19] + "…"
    return json.dumps(command, ensure_ascii=False)


def _row_view(row: dict[str, Any], trunc: bool) -> dict[str, Any]:
    view = dict(row)
    view["ID"] = row["ID"][:12] if trunc else row["ID"]
    view["Command"] = short_command(row["Command"], trunc)
    labels = row.get("Labels") or {}
    view["Labels"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    view["Label"] = lambda key: labels.get(key, "")
    view["Mounts"] = view["Networks"] = view["Size"] = ""
    return view


def ps(args: argparse.Namespace) -> int:
    rows = daemonkit.call(args.socket, {"op": "ps", "all": args.all})["containers"]
    trunc = not args.no_trunc
    views = [_row_view(r, trunc) for r in rows]
    if args.quiet:
        for view in views:
            print(view["ID"])
        return 0
    if args.format:
        fmt = gotmpl.unescape(args.format)
        if fmt.startswith("table"):
            fmt = fmt[5:].strip()
            head = gotmpl.render(fmt, {k: HEADERS.get(k, k.upper()) for k in views[0]} if views
                                 else _header_view())
            lines = [head] + [gotmpl.render(fmt, v) for v in views]
            print("\n".join(_tabbed(lines)))
            return 0
        for view in views:
            print(gotmpl.render(fmt, view))
        return 0
    print_ps_table(views)
    return 0


def print_ps_table(views: list[dict[str, Any]]) -> None:
    """``ps``'s default table of ``views`` (PS_COLUMNS), as docker and podman print it."""
    cells = [[h for h, _ in PS_COLUMNS]] + [[str(v[k]) for _, k in PS_COLUMNS] for v in views]
    print("\n".join(line.rstrip() for line in table(cells)))


def _header_view() -> dict[str, Any]:
    keys = ["ID", "Image", "Command", "CreatedAt", "RunningFor", "Ports", "State", "Status",
            "Size", "Names", "Labels", "Mounts", "Networks"]
    view: dict[str, Any] = {k: HEADERS.get(k, k.upper()) for k in keys}
    view["Label"] = lambda key: "LABEL"
    return view


def _tabbed(lines: list[str]) -> list[str]:
    rows = [line.split("\t") for line in lines]
    width = max(len(r) for r in rows)
    return table([r + [""] * (width - len(r)) for r in rows])


def inspect(args: argparse.Namespace) -> int:
    objects = daemonkit.call(args.socket, {"op": "inspect", "refs": args.names})["objects"]
    found = [o for o in objects if o is not None]
    missing = [n for n, o in zip(args.names, objects, strict=True) if o is None]
    for obj in found:
        obj.pop("CgroupDriver", None)
    if args.format:
        fmt = gotmpl.unescape(args.format)
        for obj in found:
            print(gotmpl.render(fmt, obj))
    else:
        print(json.dumps(found, indent=4))
    for name in missing:
        print(f"Error: No such object: {name}", file=sys.stderr)
    return 1 if missing else 0


def stop_or_kill(args: argparse.Namespace) -> int:
    rc = 0
    for name in args.names:
        req: dict[str, Any] = {"op": args.command, "ref": name}
        if args.command == "stop":
            req["t"] = args.time
        else:
            req["signal"] = signal_number(args.signal)
        answer = daemonkit.call(args.socket, req)
        if "error" in answer:
            print(f"Error response from daemon: {answer['error']}", file=sys.stderr)
            rc = 1
        else:
            print(name)
    return rc


def exec_(args: argparse.Namespace, environ: dict[str, str]) -> int:
    if not args.container or not args.argv:
        print('"docker exec" requires at least 2 arguments.\n'
              "See 'docker exec --help'.\n\n"
              "Usage:  docker exec [OPTIONS] CONTAINER COMMAND [ARG...]\n\n"
              "Execute a command in a running container", file=sys.stderr)
        return 1
    # `-e KEY` passes this command's own value of KEY; where it has none, KEY alone, which
    # unsets it in the container's environment (docker's opts.ValidateEnv).
    env = [e if "=" in e or e not in environ else f"{e}={environ[e]}" for e in args.env]
    found = daemonkit.call(args.socket, {"op": "inspect", "refs": [args.container]})["objects"]
    answer = ({"error": f"No such container: {args.container}"} if found[0] is None else
              daemonkit.call(args.socket, {"op": "exec", "ref": args.container, "env": env,
                                      "workdir": args.workdir}))
    if "error" in answer:
        print(f"Error response from daemon: {answer['error']}", file=sys.stderr)
        return 1
    null = os.open(os.devnull, os.O_RDWR)
    stdio = [null] * 3 if args.detach else [0 if args.interactive else null, 1, 2]
    request = {"argv": args.argv, "env": answer["env"], "cwd": answer["cwd"],
               "detach": args.detach}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as shim:
        shim.connect(answer["socket"])
        socket.send_fds(shim, [json.dumps(request).encode() + b"\n"], stdio)
        os.close(null)
        lines = shim.makefile("r")
        started = json.loads(lines.readline() or "{}")
        if "error" in started:
            if args.detach:
                print(f"Error response from daemon: {started['error']}", file=sys.stderr)
                return 1
            # Attached, moby writes the failure into the output stream, and the exec's
            # exit code is the failure's.
            sys.stdout.write(f"{started['error']}\r\n")
            return int(started["code"])
        if args.detach:
            return 0
        ended = json.loads(lines.readline() or '{"exit": 137}')
    return int(ended["exit"])


def signal_number(name: str) -> int:
    """A signal as docker and podman take it: a number, or a name with or without SIG."""
    if name.isdigit():
        return int(name)
    name = name.upper()
    return int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))


def add_container_commands(sub: Any, type_flags: tuple[str, ...] = ("--type",)) -> None:
    """``ps``, ``inspect``, ``stop`` and ``kill``, whose options podman's CLI takes as
    docker's (podman's inspect has ``-t`` for ``--type`` too: ``type_flags``)."""
    p = sub.add_parser("ps")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--no-trunc", action="store_true")
    p.add_argument("--format", default="")
    i = sub.add_parser("inspect")
    i.add_argument("-f", "--format", default="")
    i.add_argument(*type_flags, default="")
    i.add_argument("names", nargs="+")
    s = sub.add_parser("stop")
    s.add_argument("-t", "--time", "--timeout", type=int, default=10)
    s.add_argument("names", nargs="+")
    k = sub.add_parser("kill")
    k.add_argument("-s", "--signal", default="KILL")
    k.add_argument("names", nargs="+")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="docker")
    sub = parser.add_subparsers(dest="command", required=True)
    add_container_commands(sub)
    x = sub.add_parser("exec")
    x.add_argument("-d", "--detach", action="store_true")
    x.add_argument("-i", "--interactive", action="store_true")
    x.add_argument("-e", "--env", action="append", default=[])
    x.add_argument("-w", "--workdir", default="")
    # Options end at CONTAINER: whatever follows is the command's (pflag's
    # SetInterspersed(false)).
    x.add_argument("container", nargs="?", default="")
    x.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND")
    sub.add_parser("info").add_argument("-f", "--format", default="")
    return parser.parse_args(argv)


def daemon_host(argv: list[str], environ: dict[str, str]) -> tuple[str, list[str]]:
    """The daemon's address and the arguments left: ``-H``/``--host`` (``-H X``, ``-H=X``,
    ``-HX``, ``--host X``, ``--host=X``) before the command, else ``DOCKER_HOST``, else
    root's daemon; ``unix://`` alone is root's too (docker's opts.ParseHost). ValueError
    for two ``-H``."""
    hosts: list[str] = []
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        word = rest.pop(0)
        if word in ("-H", "--host"):
            if not rest:
                raise ValueError("flag needs an argument: " +
                                 ("'H' in -H" if word == "-H" else word))
            hosts.append(rest.pop(0))
        elif word.startswith("--host="):
            hosts.append(word[len("--host="):])
        elif word.startswith("-H"):
            hosts.append(word[2:].removeprefix("="))
        else:
            rest.insert(0, word)
            break
    if len(hosts) > 1:
        raise ValueError("Please specify only one -H")
    host = hosts[0] if hosts else environ.get("DOCKER_HOST", "")
    if host in ("", "unix://"):
        host = DEFAULT_HOST
    return host, rest


def main(argv: list[str], environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ) if environ is None else environ
    try:
        host, argv = daemon_host(argv, environ)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    # `docker container ls|inspect|stop|kill` are the same commands.
    if argv[:1] == ["container"]:
        argv = [{"ls": "ps", "list": "ps"}.get(argv[1], argv[1]), *argv[2:]] if argv[1:] else []
    args = parse_args(argv)
    # Only unix sockets here: any other address is one nothing answers on.
    args.socket = host.removeprefix("unix://") if host.startswith("unix://") else ""
    try:
        if args.command == "ps":
            return ps(args)
        if args.command == "inspect":
            return inspect(args)
        if args.command == "exec":
            return exec_(args, environ)
        if args.command == "info":
            info = daemonkit.call(args.socket, {"op": "info"})
            print(gotmpl.render(gotmpl.unescape(args.format), info) if args.format
                  else f"Cgroup Driver: {info['CgroupDriver']}")
            return 0
        return stop_or_kill(args)
    except daemonkit.Unavailable:
        print(NO_DAEMON.format(host=host), file=sys.stderr)
        return 1
    except gotmpl.TemplateError as exc:
        print(f"template parsing error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
