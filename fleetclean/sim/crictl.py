"""``crictl`` on a simulated node: ``ps``, ``pods``, ``inspect``, ``inspectp``, ``stop``, as
cri-tools prints them.

Runs inside a node (installed as ``/usr/local/sbin/crictl`` once the node has a kubelet;
standard library only). ``ps`` and ``pods``: tables (``-a``, ``-q``, ``-o json``, ``--name``,
``--namespace``, ``--pod``); ``inspect ID``: the container's status JSON, or with ``-o
go-template --template T`` the template over it, e.g. the pod a container belongs to::

    crictl inspect -o go-template --template \\
        '{{index .status.labels "io.kubernetes.pod.namespace"}}/'\\
        '{{index .status.labels "io.kubernetes.pod.name"}}' ID

Errors as crictl's (logrus' ``level=fatal`` line when not on a terminal), exit 1.

>>> ago(time.time() - 125)
'2 minutes ago'
"""

from __future__ import annotations

import argparse
import calendar
import json
import sys
import time
from typing import Any

if __package__:
    from fleetclean.sim import containers, daemonkit, gotmpl
    from fleetclean.sim.dockercli import table
else:  # run as a script: the sibling modules are found through sys.path[0]
    import containers  # type: ignore[import-not-found,no-redef]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import gotmpl  # type: ignore[import-not-found,no-redef]
    from dockercli import table  # type: ignore[import-not-found,no-redef]

SOCKET = containers.CONTAINERD_SOCK
STATES = {"CONTAINER_RUNNING": "Running", "CONTAINER_EXITED": "Exited",
          "CONTAINER_CREATED": "Created"}


def ago(t: float) -> str:
    return containers.human_duration(time.time() - t) + " ago"


def fatal(message: str) -> int:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f'time="{stamp}" level=fatal msg={json.dumps(message)}', file=sys.stderr)
    return 1


def _since(iso_time: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(iso_time[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return time.time()


def ps(args: argparse.Namespace) -> int:
    rows = daemonkit.call(SOCKET, {"op": "ps", "all": args.all})["containers"]
    pods = {p["id"]: p for p in daemonkit.call(SOCKET, {"op": "pods"})["pods"]}
    if args.name:
        rows = [r for r in rows if args.name in r["status"]["metadata"]["name"]]
    if args.pod:
        rows = [r for r in rows if r["info"]["sandboxID"].startswith(args.pod)]
    if args.output == "json":
        print(json.dumps({"containers": [r["status"] for r in rows]}, indent=2))
        return 0
    if args.quiet:
        for r in rows:
            print(r["status"]["id"])
        return 0
    cells = [["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"]]
    for r in rows:
        st, sandbox = r["status"], r["info"]["sandboxID"]
        cells.append([st["id"][:13], st["image"]["image"], ago(_since(st["createdAt"])),
                      STATES.get(st["state"], st["state"]), st["metadata"]["name"],
                      str(st["metadata"]["attempt"]), sandbox[:13],
                      pods.get(sandbox, {}).get("name", "")])
    print("\n".join(line.rstrip() for line in table(cells, minwidth=20)))
    return 0


def pods(args: argparse.Namespace) -> int:
    found = daemonkit.call(SOCKET, {"op": "pods"})["pods"]
    if args.name:
        found = [p for p in found if args.name in p["name"]]
    if args.namespace:
        found = [p for p in found if p["namespace"] == args.namespace]
    if args.output == "json":
        items = [{"id": p["id"], "metadata": {"name": p["name"], "uid": p["uid"],
                  "namespace": p["namespace"], "attempt": 0}, "state": p["state"]}
                 for p in found]
        print(json.dumps({"items": items}, indent=2))
        return 0
    if args.quiet:
        for p in found:
            print(p["id"])
        return 0
    cells = [["POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME"]]
    cells += [[p["id"][:13], ago(p["created"]), "Ready", p["name"], p["namespace"], "0",
               "(default)"] for p in found]
    print("\n".join(line.rstrip() for line in table(cells, minwidth=20)))
    return 0


def inspect(args: argparse.Namespace) -> int:
    for ref in args.ids:
        op = "inspectp" if args.command == "inspectp" else "inspect"
        answer = daemonkit.call(SOCKET, {"op": op, "ref": ref})
        if "error" in answer:
            what = "pod sandbox" if op == "inspectp" else "container"
            return fatal(f'getting the status of the {what} "{ref}": rpc error: code = NotFound '
                         f'desc = an error occurred when try to find {what} "{ref}": not found')
        doc: dict[str, Any] = answer.get("status") or {"status": answer["pod"]}
        if args.output == "go-template":
            print(gotmpl.render(args.template, doc))
        else:
            print(json.dumps(doc, indent=2))
    return 0


def stop(args: argparse.Namespace) -> int:
    for ref in args.ids:
        if "error" in daemonkit.call(SOCKET, {"op": "stop", "ref": ref}):
            return fatal(f'stopping the container "{ref}": rpc error: code = NotFound desc = '
                         f'an error occurred when try to find container "{ref}": not found')
        print(ref)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="crictl")
    parser.add_argument("-r", "--runtime-endpoint", default="")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("ps", "pods"):
        p = sub.add_parser(name)
        p.add_argument("-a", "--all", action="store_true")
        p.add_argument("-q", "--quiet", action="store_true")
        p.add_argument("-o", "--output", default="table")
        p.add_argument("--name", default="")
        p.add_argument("--namespace", default="")
        p.add_argument("-p", "--pod", default="")
    for name in ("inspect", "inspectp"):
        i = sub.add_parser(name)
        i.add_argument("-o", "--output", default="json")
        i.add_argument("--template", default="")
        i.add_argument("ids", nargs="+")
    sub.add_parser("stop").add_argument("ids", nargs="+")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    commands = {"ps": ps, "pods": pods, "inspect": inspect, "inspectp": inspect, "stop": stop}
    try:
        return commands[args.command](args)
    except daemonkit.Unavailable:
        return fatal(f"validate service connection: validate CRI v1 runtime API for endpoint "
                     f'"unix://{SOCKET}": rpc error: code = Unavailable desc = connection error')
    except gotmpl.TemplateError as exc:
        return fatal(f"failed to parse go-template: {exc}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
