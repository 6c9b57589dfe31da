"""What the status script costs on a busy 8-GPU node, against one bare nvidia-smi query.

Run as root on Linux: ``.venv/bin/python benchmarks/node_status.py [--rounds 5] [--n 20]``.
Starts a one-node simulated fleet (nvidia-persistenced on every GPU, as by default), renders
``status`` for it, and inside the node times, in alternating rounds of ``--n`` calls each,
(a) the rendered script as sshd has it run: the command of ``transport.boot`` (which the
login shell execs; by the checkout that rendered the script, for ``--against``) starts its
GPU read, reads the script whole from a pipe, then runs it (a here-string: bash 5.1 and
later pass one that fits a pipe through a pipe); as for a host
never seen and, as ``status_seen_clean``, for a host whose GPUs all read clean at its last
status (``results/lastclean.py``: the -q read's code parsed only where it is read; since
issue 18's thirty-second round each node picks its read, ``--query-gpu`` where its kernel
counts no CUDA process, -q where it counts some: render.early_reads), (b) the bare query
the peers run,
``nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total
--format=csv,noheader,nounits``, and (c) the same query as pdsh or ssh run it, through a
login shell (``bash -c '<query>'``): first on the idle node, then with an SGLang tp8 workload
(every GPU busy: the script names eight processes), where ``status_seen_busy`` is the
script of a host whose last status named these workers (results/lastclean.py: it reads
them while its -q read runs; against ``--against``'s plain script). Wall and CPU
(user+sys of the process and its children, bash's ``times``) are per call; the ratios are
same-run, status over (b) and over (c): min/median/max over the rounds, and the best status
over the best bare query (the figure least moved by other load on the machine). The fake
nvidia-smi is a Python script (tens of ms of CPU, where a real one waits on the driver), so
absolute numbers are the fake's; the ratio is what #18 bounds (<= 1.2x on a busy node).

``--real``: on a machine with a real ``nvidia-smi`` and no simulator (a real H200 node),
the script is rendered for this machine (``fleetclean show status --local``) and run here
with bash, in the same alternating rounds against the same bare queries, on the machine as
it is (idle or busy). Status only reads (nvidia-smi, /proc, the kernel log): nothing is
signalled. ``--against DIR``: another checkout's status script (rendered by that checkout's
code for the same node) is timed in the same alternating rounds as ``against`` (and its
script for a host seen clean as ``against_seen_clean``), each ratio status/against its own:
a before/after in one run. ``--out FILE`` also writes the figures
as JSON, in either mode; ``--parts`` adds
rounds of the script's parts alone (``nvidia-smi -q -d MEMORY,PIDS``, with and without
``ROW_REMAPPER``, which the script reads only where the kernel log cannot rule it out, the old
two CSV queries, ``dmesg``, ``bash -c true``, the script's definitions only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetclean.transport import boot

SUBNET = 91
BARE = ("nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total "
        "--format=csv,noheader,nounits")
BARE_SHELL = f"bash -c '{BARE}'"
# The script's parts, each alone (--parts); its definitions are timed parsed from memory, as
# its first command has them parsed (without that command and the last, fc_main's call).
PARTS = {
    "nvidia-smi -q -d MEMORY,PIDS": "nvidia-smi -q -d MEMORY,PIDS",
    "nvidia-smi -q -d MEMORY,PIDS,ROW_REMAPPER": "nvidia-smi -q -d MEMORY,PIDS,ROW_REMAPPER",
    "old: two CSV queries in parallel": (
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid "
        "--format=csv,noheader,nounits & nvidia-smi --query-gpu=index,uuid,name,memory.used,"
        "memory.total,retired_pages.pending,remapped_rows.pending "
        "--format=csv,noheader,nounits; wait"),
    "dmesg": "dmesg",
    "bash -c true": "bash -c true",
    "bash -c <the script without its bootstrap and fc_main lines>": 'bash -c "$DEFS"',
}
# Wall time and the CPU of every child, from bash itself (no /usr/bin/time in a node). $S
# is the script, $DEFS the script without its last line: fed to bash -s as here-strings.
TIMER = r"""
n=$1; S=$(<"$2"); BOOT=$3; shift 3
DEFS=${S#*read -r -N *$'\n'}
DEFS=${DEFS%fc_main </dev/null*}
t0=$EPOCHREALTIME
for ((i = 0; i < n; i++)); do eval "$*" >/dev/null 2>&1; done
t1=$EPOCHREALTIME
echo "$t0 $t1"
times
"""
Runner = Callable[[list[str]], str]  # argv -> its stdout, in the node or here
# What sshd's login shell runs for each script, by its path, as the checkout that rendered
# the script makes it (transport.boot.command: its GPU read started first, then the script
# read whole): the login shell execs it, so it is timed without one.
BOOTS: dict[str, str] = {}


def boot_command(text: str, checkout: Path | None = None) -> str:
    """``transport.boot.command`` for the script ``text``, by this checkout or ``checkout``."""
    if checkout is None:
        return boot.command(len(text.encode()), boot.first_read(text))
    code = ("import sys; from fleetclean.transport import boot; t = sys.stdin.read(); "
            "print(boot.command(len(t.encode()), boot.first_read(t)), end='')")
    return subprocess.run([sys.executable, "-c", code], input=text, capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": str(checkout)},
                          cwd=checkout).stdout


def _cpu_seconds(field: str) -> float:
    minutes, seconds = field.rstrip("s").split("m")
    return int(minutes) * 60 + float(seconds)


def measure(run: Runner, n: int, command: str, script: str) -> tuple[float, float]:
    """(wall, cpu) seconds per call of ``command``, run by ``run``; ``$S`` in it is the
    script at the path ``script``, ``$BOOT`` the command sshd's login shell runs for it
    (transport.boot: a status's GPU read started, the script read whole from standard
    input, then run)."""
    stdout = run(["bash", "-c", TIMER, "timer", str(n), script, BOOTS[script], command])
    # `times` prints the shell's own CPU, then its children's: the calls are children.
    lines = stdout.splitlines()
    t0, t1 = lines[0].split()
    user, sys_ = lines[-1].split()
    return (float(t1) - float(t0)) / n, (_cpu_seconds(user) + _cpu_seconds(sys_)) / n


def rounds(run: Runner, args: argparse.Namespace, label: str, script: str, *,
           against: str = "", seen_clean: str = "", against_seen_clean: str = "",
           seen_busy: str = "") -> dict[str, Any]:
    # As sshd runs it: boot's command, which the login shell execs, reads the script whole
    # from the pipe, then runs it (under `bash -s` bash would read a byte a read(2)).
    status = 'eval "$BOOT" <<<"$S"'
    commands = [("status", status, script), ("bare", BARE, script),
                ("bare_shell", BARE_SHELL, script)]
    if seen_clean:
        commands.append(("status_seen_clean", status, seen_clean))
    if seen_busy:
        commands.append(("status_seen_busy", status, seen_busy))
    if against:
        commands.append(("against", status, against))
    if against_seen_clean:
        commands.append(("against_seen_clean", status, against_seen_clean))
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in commands}
    for _ in range(args.rounds):
        for name, command, text in commands:
            runs[name].append(measure(run, args.n, command, text))
        print(f"{label}: " + " | ".join(
            f"{name} {runs[name][-1][0] * 1000:6.1f} / {runs[name][-1][1] * 1000:6.1f} ms"
            for name in runs) + " (wall / cpu)", flush=True)
    figures: dict[str, Any] = {
        f"{name}_ms": {"wall": [w * 1000 for w, _ in xs], "cpu": [c * 1000 for _, c in xs]}
        for name, xs in runs.items()}
    for which in [s for s in ("status", "status_seen_clean", "status_seen_busy") if s in runs]:
        for plain in [b for b in ("bare", "bare_shell", "against") if b in runs]:
            key = plain + which[len("status"):]
            # The other checkout's seen-clean script, where it has one, is the seen-clean
            # script's before; a script that reads the PIDs named last time is against
            # the other checkout's plain one (-q, as a host seen in use reads).
            base = key if key in runs else plain
            for i, name in enumerate(("wall", "cpu")):
                xs = [s[i] / b[i] for s, b in zip(runs[which], runs[base], strict=True)]
                print(f"{label}: {name} ratio {which}/{base}: min {min(xs):.2f} median "
                      f"{statistics.median(xs):.2f} max {max(xs):.2f}")
                figures[f"{name}_ratio_{key}"] = {"min": min(xs),
                                                  "median": statistics.median(xs),
                                                  "max": max(xs)}
            best = (min(w for w, _ in runs[which]), min(w for w, _ in runs[base]))
            figures[f"best_ratio_{key}"] = best[0] / best[1]
            print(f"{label}: best {which} {best[0] * 1000:.1f} ms / best {base} "
                  f"{best[1] * 1000:.1f} ms = {best[0] / best[1]:.2f}x")
    if args.parts:
        figures["parts_ms"] = {}
        for name, command in PARTS.items():
            ws, cs = zip(*(measure(run, args.n, command, script) for _ in range(args.rounds)),
                         strict=True)
            figures["parts_ms"][name] = {"wall": statistics.median(ws) * 1000,
                                         "cpu": statistics.median(cs) * 1000}
            print(f"{label}: part {name}: median wall {statistics.median(ws) * 1000:.1f} ms "
                  f"cpu {statistics.median(cs) * 1000:.1f} ms")
    return figures


def local(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def render(args: argparse.Namespace, where: list[str], checkout: Path | None = None,
           seen_clean: bool = False, named: list[list[int]] | None = None) -> str:
    """``fleetclean show status`` for ``where`` (``--local``, or an inventory and a host),
    by this checkout's code or by ``checkout``'s; ``seen_clean``: for a host whose GPUs all
    read clean at its last status (results/lastclean.py), else for one never seen (the node
    picks the early read either way, render.early_reads); ``named``: for a host whose last
    status named these processes ([PID, start time] each: gpu_processes)
    (results/lastclean.py: read while its -q read runs)."""
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "FLEETCLEAN_STATE_DIR": state}
        if checkout:
            env["PYTHONPATH"] = str(checkout)

        def show() -> str:
            return subprocess.run([sys.executable, "-m", "fleetclean", "show", "status",
                                   *where], capture_output=True, text=True, check=True,
                                  env=env, cwd=checkout).stdout

        text = show()
        host = json.loads(text.split("# host: ", 1)[1].split("  mode:", 1)[0])
        if named:
            (Path(state) / "last-named.json").write_text(
                json.dumps({"hosts": {host: [time.time(), named]}}))
        if seen_clean:
            (Path(state) / "last-clean.json").write_text(
                json.dumps({"hosts": {host: time.time()}}))
        if named or seen_clean:
            text = show()
            # Both hints say so in the script's header (render.LAST_CLEAN_NOTE and
            # NAMED_NOTE, in every checkout since the fifteenth round).
            if ("FC_VHINT=" if named else "read clean at the host's last status") not in text:
                raise LookupError(f"{checkout or 'this checkout'}: the hint was not taken")
        return text


def gpu_processes(run: Runner) -> list[list[int]]:
    """[PID, start time] of each compute app nvidia-smi lists where ``run`` runs, as
    last-named.json keeps them."""
    out = run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    named = []
    for pid in sorted({int(word) for word in out.split() if word.isdigit()}):
        stat = run(["cat", f"/proc/{pid}/stat"])
        named.append([pid, int(stat.rsplit(")", 1)[1].split()[19])])
    return named


def against_seen_clean(args: argparse.Namespace, where: list[str]) -> str:
    """The ``--against`` checkout's script for a host seen clean, or "" where that
    checkout has no such read (before the fifteenth round)."""
    try:
        return render(args, where, args.against, seen_clean=True)
    except LookupError:
        return ""


def real(args: argparse.Namespace) -> dict[str, Any]:
    """This machine as it is, with its own nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("node_status.py --real: no nvidia-smi on PATH")
    gpus = local(["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv,noheader"])
    print(f"this machine: {len(gpus.splitlines())} GPUs, {gpus.splitlines()[:1]} ...")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "status.sh"
        clean = Path(tmp) / "seen_clean.sh"
        texts = {str(path): (render(args, ["--local"]), None),
                 str(clean): (render(args, ["--local"], seen_clean=True), None)}
        apps = gpu_processes(local)
        busy = str(Path(tmp) / "seen_busy.sh") if apps else ""
        if busy:
            texts[busy] = (render(args, ["--local"], named=apps), None)
        other = other_clean = ""
        if args.against:
            other = str(Path(tmp) / "against.sh")
            texts[other] = (render(args, ["--local"], args.against), args.against)
            text = against_seen_clean(args, ["--local"])
            if text:
                other_clean = str(Path(tmp) / "against_seen_clean.sh")
                texts[other_clean] = (text, args.against)
        for name, (text, checkout) in texts.items():
            Path(name).write_text(text)
            BOOTS[name] = boot_command(text, checkout)
        return {"gpus": gpus.splitlines(), "as found": rounds(
            local, args, "as found", str(path), against=other, seen_clean=str(clean),
            against_seen_clean=other_clean, seen_busy=busy)}


def simulated(args: argparse.Namespace) -> dict[str, Any]:
    from fleetclean.sim import SimFleet

    with tempfile.TemporaryDirectory() as tmp:
        fleet = SimFleet.up(1, Path(tmp), subnet=args.subnet)
        try:
            where = ["-i", str(fleet.inventory_path), "--host", "node01"]
            texts = {"/tmp/status.sh": (render(args, where), None),
                     "/tmp/seen_clean.sh": (render(args, where, seen_clean=True), None)}
            other = other_clean = ""
            if args.against:
                other = "/tmp/against.sh"
                texts[other] = (render(args, where, args.against), args.against)
                text = against_seen_clean(args, where)
                if text:
                    other_clean = "/tmp/against_seen_clean.sh"
                    texts[other_clean] = (text, args.against)
            for path, (text, checkout) in texts.items():
                fleet.node_path("node01", path).write_text(text)
                BOOTS[path] = boot_command(text, checkout)

            def in_node(argv: list[str]) -> str:
                return fleet.run_in("node01", argv).stdout

            figures = {"idle": rounds(in_node, args, "idle", "/tmp/status.sh", against=other,
                                      seen_clean="/tmp/seen_clean.sh",
                                      against_seen_clean=other_clean)}
            fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
            # A host seen in use last time, naming the same workers: -q, the workers read
            # while it runs.
            apps = gpu_processes(in_node)
            text = render(args, where, named=apps)
            fleet.node_path("node01", "/tmp/seen_busy.sh").write_text(text)
            BOOTS["/tmp/seen_busy.sh"] = boot_command(text)
            # A host seen clean and then in use: -q, as the node's count says (before the
            # thirty-second round: the query, then the apps after it).
            figures["busy"] = rounds(in_node, args, "busy", "/tmp/status.sh", against=other,
                                     seen_clean="/tmp/seen_clean.sh",
                                     against_seen_clean=other_clean,
                                     seen_busy="/tmp/seen_busy.sh")
            return figures
        finally:
            fleet.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--subnet", type=int, default=SUBNET, help="addresses 127.S.x.y")
    ap.add_argument("--real", action="store_true",
                    help="this machine's own nvidia-smi, no simulator (read-only)")
    ap.add_argument("--out", type=Path, metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--parts", action="store_true", help="also time the script's parts alone")
    ap.add_argument("--against", type=Path, metavar="DIR",
                    help="also time the status script another checkout renders (before/after)")
    args = ap.parse_args()
    figures = real(args) if args.real else simulated(args)
    if args.out:
        doc = {"mode": "real" if args.real else "simulated", "rounds": args.rounds,
               "calls_per_round": args.n, **figures}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
