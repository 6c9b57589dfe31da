"""Classification at scale: does every host get the status the simulator knows is true?

Run as root on Linux: ``.venv/bin/python benchmarks/scale.py [--nodes 256] [--forks 64]``
(``--nodes 1000`` for the issue's size). It brings up N simulated nodes, makes some busy
(an SGLang tp8 server on every 10th node, a SIGTERM-ignoring holder, a slow-to-exit one),
breaks some (nvidia-smi exit 18, or a driver it waits in for good: ``hang``) and makes
some slow to log in (``sim fault NODE slow-banner S`` and ``slow-auth S`` where this
simulator has them; skipped and said so where not), then runs
``status`` (several times), ``post-extraction`` and ``status`` again with ``--json``.

Truth comes from the simulator itself, read just before (status) or just after
(post-extraction) each run: a node whose nvidia-smi cannot answer must be ``error``, one with
memory in use ``dirty``, the others ``clean``. A node made slow on purpose may also be
``timeout`` (the issue: slow is timeout or late success, never ``auth_failed``).

Per command it prints wall time, misclassified hosts, the controller's CPU per host, its
peak RSS, and its peak threads and open file descriptors: user+sys and ru_maxrss of that one
child from ``os.wait4`` (so the simulator's own processes are not counted), threads and fds
sampled from ``/proc/PID/status`` and ``/proc/PID/fd`` every 10 ms while it runs.

``--bastion``: node01 becomes a bastion with OpenSSH's own limits (MaxStartups 10:30:100,
MaxSessions 10) and the other nodes are reached through it, by ``ProxyJump`` (one shared
connection) and by ``ProxyCommand ssh -W`` (one bastion connection per host); each run also
prints the bastion's logins and the connections it dropped past MaxStartups.
``--watch N``: ``status --watch``'s cost, a first run against N refreshes on its kept
connections (one process, each run's CPU from getrusage). ``--table``: after the first
statuses, one more ``status`` as a person reads it (the table, 120 columns, not a terminal),
its length printed with its problem lines: what a busy, partly broken fleet's output is
at this size. Exit status 1 when any host was
misclassified. Not a CI test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetclean.commands import memory
from fleetclean.models import HostStatus
from fleetclean.sim import SimFleet

ROOT = Path(__file__).resolve().parent.parent
FLEETCLEAN = str(ROOT / ".venv" / "bin" / "fleetclean")
SUBNETS = range(92, 100)  # away from tests (20..89, 100..249) and the other benchmarks
SLOW_LOGIN_S = 2.0


@dataclass
class Run:
    label: str
    wall_s: float
    cpu_s: float
    maxrss_mib: float
    code: int
    hosts: dict[str, str]  # host -> status
    threads: int = 0  # peaks, sampled
    fds: int = 0


def free_subnet() -> int:
    for subnet in SUBNETS:
        want = "{:08X}:0016".format(int.from_bytes(bytes((127, subnet, 1, 1)), "little"))
        with open("/proc/net/tcp") as f:
            if not any(line.split()[1] == want for line in list(f)[1:]):
                return subnet
    raise SystemExit("no free 127.S.0.0/16 in 92..99")


class Peaks:
    """Peak thread and fd counts of a running process, sampled from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid, self.threads, self.fds = pid, 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
                threads = int(next(ln.split()[1] for ln in status.splitlines()
                                   if ln.startswith("Threads:")))
                fds = len(os.listdir(f"/proc/{self.pid}/fd"))
            except (OSError, StopIteration, ValueError):
                continue  # not started yet, or exiting
            self.threads, self.fds = max(self.threads, threads), max(self.fds, fds)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def controller(label: str, argv: list[str], program: list[str] | None = None,
               env: dict[str, str] | None = None) -> tuple[Run, dict[str, Any]]:
    """Run fleetclean (or ``program``) once; its own CPU and peak RSS come from wait4 on
    that child, its peak threads and fds from /proc while it runs."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([*(program or [FLEETCLEAN]), *argv], stdout=out, stderr=err,
                                env=env)
        peaks = Peaks(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        peaks.stop()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        try:
            data: dict[str, Any] = json.loads(out.read())
        except ValueError:
            raise SystemExit(f"{label}: no JSON (exit {proc.returncode}): "
                             f"{err.read().decode()[-400:]}") from None
    hosts = {h["host"]: h["status"] for h in data.get("hosts", [])}
    return Run(label, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
               proc.returncode, hosts, peaks.threads, peaks.fds), data


def truth(fleet: SimFleet, names: list[str]) -> dict[str, str]:
    """What each node really is now, read through the simulator, not through SSH (one
    nsenter and fake nvidia-smi per node, a few at a time)."""
    def one(name: str) -> str:
        # A driver/library mismatch (the nvml fault) is faulty: a reboot is due.
        # So is a driver nvidia-smi waits in for good (the hang fault), whose GPUs no read
        # gets (nor this one's).
        fault = fleet.node(name).dir / "fault"
        if fault.is_file() and fault.read_text().strip() in ("nvml", "hang"):
            return "faulty"
        used = fleet.gpu_used_mib(name)
        return "error" if not used else "dirty" if any(used) else "clean"

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def slow_banner_supported() -> bool:
    done = subprocess.run([FLEETCLEAN, "sim", "fault", "--help"], capture_output=True,
                          text=True, check=False)
    return "slow-banner" in done.stdout


WORKLOADS = (  # (every ..th node, at offset, kind, options, label)
    (10, 1, "sglang", {}, "sglang tp8"),
    (20, 5, "stubborn", {"gpu": 3}, "stubborn (ignores SIGTERM)"),
    (32, 7, "slow", {"gpu": 2, "delay": 3.0}, "slow to exit (3 s)"),
)


def prepare(fleet: SimFleet, *, slow_logins: bool) -> tuple[Counter[str], set[str]]:
    """Workloads and faults by node index; returns what was set up and the slow nodes."""
    made: Counter[str] = Counter()
    slow: set[str] = set()
    taken: set[str] = set()
    for every, offset, kind, opts, label in WORKLOADS:
        names = [n.name for i, n in enumerate(fleet.nodes, start=1)
                 if i % every == offset and n.name not in taken]
        fleet.spawn_all(names, kind, **opts)
        taken.update(names)
        made[label] += len(names)
    for i, node in enumerate(fleet.nodes, start=1):
        if i % 50 == 13 and node.name not in taken:
            fleet.set_fault(node.name, "nvml")
            made["nvidia-smi exit 18"] += 1
        elif i % 100 == 37 and node.name not in taken:
            fleet.set_fault(node.name, "hang")
            made["nvidia-smi never answers (hang)"] += 1
        fault = {9: "slow-banner", 17: "slow-auth"}.get(i % 25) if slow_logins else None
        if fault:
            fleet.set_fault(node.name, fault, SLOW_LOGIN_S)
            slow.add(node.name)
            made[f"slow login ({SLOW_LOGIN_S:g} s {fault})"] += 1
    return made, slow


def misclassified(run: Run, known: dict[str, str], slow: set[str]) -> list[str]:
    wrong = []
    for host, want in known.items():
        got = run.hosts.get(host, "missing")
        if got != want and not (host in slow and got == "timeout"):
            wrong.append(f"{host}: {got}, simulator says {want}")
    return wrong


HEADER = (f"{'command':<28} {'wall s':>7} {'misclassified':>11} {'CPU ms/host':>10} "
          f"{'RSS MiB':>8} {'threads':>7} {'fds':>5}   statuses")


def report(run: Run, wrong: list[str], nodes: int) -> None:
    counts = ", ".join(f"{s} {n}" for s, n in sorted(Counter(run.hosts.values()).items()))
    print(f"{run.label:<28} {run.wall_s:>7.2f} {len(wrong):>5}/{nodes:<5} "
          f"{run.cpu_s * 1000 / nodes:>10.2f} {run.maxrss_mib:>8.1f} {run.threads:>7} "
          f"{run.fds:>5}   {counts}", flush=True)
    for line in wrong[:10]:
        print(f"    {line}")
    if len(wrong) > 10:
        print(f"    … {len(wrong) - 10} more")


WATCH_PY = r"""
import json, resource, sys, time
from fleetclean import fleet
from fleetclean.commands.env import Env
from fleetclean.commands.parser import build_parser
from fleetclean.commands.steps import options, render_jobs, select_hosts
from fleetclean.transport.session import Session

refreshes, argv = int(sys.argv[1]), sys.argv[2:]
args = build_parser().parse_args(["status", *argv])
name, jobs, _ = render_jobs("status", select_hosts(args, Env()), [], check=False, force=False)
opts = options(args)


def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


runs = []
with Session(opts, keep=True) as session:  # what `status --watch` does between refreshes
    for _ in range(refreshes + 1):
        c, t = cpu(), time.perf_counter()
        result = fleet.run_fleet(jobs, playbook=name, opts=opts, forks=args.forks,
                                 session=session)
        runs.append({"wall_s": time.perf_counter() - t, "cpu_s": cpu() - c})
json.dump({"runs": runs, "hosts": [{"host": h.host, "status": h.status.value}
                                   for h in result.hosts]}, sys.stdout)
"""


def sshd_log_count(fleet: SimFleet, needle: str, names: list[str] | None = None) -> int:
    total = 0
    for node in fleet.nodes:
        if names is None or node.name in names:
            total += (node.dir / "sshd.log").read_text(errors="replace").count(needle)
    return total


def classified(fleet: SimFleet, label: str, argv: list[str], names: list[str],
               slow: set[str]) -> int:
    """One run, classified against the simulator's truth; returns misclassified hosts."""
    before = truth(fleet, names) if argv[0] == "status" else None
    run, _ = controller(label, argv)
    known = before or truth(fleet, names)
    wrong = misclassified(run, known, slow)
    report(run, wrong, len(names))
    return len(wrong)


def bastion_runs(fleet: SimFleet, tmp: Path, forks: int, slow: set[str]) -> int:
    """Every node but node01 through node01, a bastion with OpenSSH's own limits."""
    fleet.set_sshd_limits("node01")
    targets = [n.name for n in fleet.nodes[1:]]
    inventory = tmp / "targets.ini"
    inventory.write_text("".join(f"{t}\n" for t in targets))
    sim = fleet.ssh_config_path.read_text()
    routes = {
        "ProxyJump": "Host * !node01\n    ProxyJump node01\n",
        "ProxyCommand ssh -W": f"Host * !node01\n    ProxyCommand ssh -F "
                               f"{fleet.ssh_config_path} -W %h:%p node01\n",
    }
    wrong = 0
    for route, head in routes.items():
        config = tmp / f"{route.split()[0]}.cfg"
        config.write_text(head + sim)
        where = ["-i", str(inventory), "-F", str(config), "-f", str(forks), "--json"]
        for label, argv in ((f"status via {route}", ["status", *where]),
                            (f"post-extr. via {route}", ["run", "post-extraction", *where,
                                                         "--no-record", "-e", "grace=1"])):
            logins = sshd_log_count(fleet, "Accepted publickey", ["node01"])
            drops = sshd_log_count(fleet, "past MaxStartups", ["node01"])
            run_wrong = classified(fleet, label, argv, targets, slow)
            logins = sshd_log_count(fleet, "Accepted publickey", ["node01"]) - logins
            drops = sshd_log_count(fleet, "past MaxStartups", ["node01"]) - drops
            print(f"{'':<28} bastion node01: {logins} logins, {drops} connections dropped "
                  "past MaxStartups", flush=True)
            wrong += run_wrong
    return wrong


def watch_runs(fleet: SimFleet, where: list[str], refreshes: int) -> None:
    """``status --watch``: a first run, then ``refreshes`` on the kept connections, in a
    process started as the CLI's watch starts itself (commands/memory.py)."""
    logins = sshd_log_count(fleet, "Accepted publickey")
    tunables = memory.wanted(os.environ)
    env = dict(os.environ, **({"GLIBC_TUNABLES": tunables} if tunables else {}))
    run, data = controller("status --watch", [str(refreshes), *where],
                           program=[sys.executable, "-c", WATCH_PY], env=env)
    logins = sshd_log_count(fleet, "Accepted publickey") - logins
    n = len(fleet.nodes)
    first, rest = data["runs"][0], data["runs"][1:]
    rest_cpu = sorted(r["cpu_s"] for r in rest)
    rest_wall = sorted(r["wall_s"] for r in rest)
    print(f"{'watch: first run':<28} {first['wall_s']:>7.2f} {'':>11} "
          f"{first['cpu_s'] * 1000 / n:>10.2f}")
    print(f"{'watch: refresh (median)':<28} {rest_wall[len(rest) // 2]:>7.2f} {'':>11} "
          f"{rest_cpu[len(rest) // 2] * 1000 / n:>10.2f}   "
          f"(min-max {rest_cpu[0] * 1000 / n:.2f}-{rest_cpu[-1] * 1000 / n:.2f} ms/host, "
          f"{rest_wall[0]:.2f}-{rest_wall[-1]:.2f} s)")
    print(f"{'':<28} {logins} logins for {n} hosts and {refreshes + 1} runs; whole process "
          f"peak {run.threads} threads, {run.fds} fds, {run.maxrss_mib:.0f} MiB", flush=True)


def table_run(fleet: SimFleet, where: list[str]) -> None:
    """One status as a person reads it: how many lines, and the problem lines."""
    proc = subprocess.run([FLEETCLEAN, "status", *where], capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="120"), check=False)
    lines = proc.stdout.splitlines()
    statuses = {s.value for s in HostStatus}
    problems = [line for line in lines if line.split(": ")[1:2] and any(
        f": {s}: " in line for s in statuses)]
    print(f"{'status (the table)':<28} exit {proc.returncode}: {len(lines)} lines for "
          f"{len(fleet.nodes)} hosts, {len(problems)} problem lines:", flush=True)
    for line in problems:
        print(f"    {line[:160]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--forks", type=int, default=64)
    ap.add_argument("--status-reps", type=int, default=3)
    ap.add_argument("--bastion", action="store_true",
                    help="also every node but node01 through node01 at OpenSSH's limits")
    ap.add_argument("--watch", type=int, default=0, metavar="N",
                    help="also status --watch: a first run and N refreshes")
    ap.add_argument("--skip-direct", action="store_true", help="leave out the direct runs")
    ap.add_argument("--table", action="store_true",
                    help="also one status as the table, its length and problem lines")
    args = ap.parse_args()
    slow_logins = slow_banner_supported()
    with tempfile.TemporaryDirectory(prefix="fleetclean-scale-") as tmp:
        started = time.perf_counter()
        with SimFleet.up(args.nodes, Path(tmp) / "fleet", subnet=free_subnet()) as fleet:
            up_s = time.perf_counter() - started
            made, slow = prepare(fleet, slow_logins=slow_logins)
            names = [n.name for n in fleet.nodes]
            print(f"{args.nodes} nodes up in {up_s:.1f} s; "
                  + ", ".join(f"{k}: {v}" for k, v in made.items())
                  + ("" if slow_logins else "; slow logins: no slow-banner fault in this "
                     "simulator, skipped"))
            where = ["-i", str(fleet.inventory_path), "-F", str(fleet.ssh_config_path),
                     "-f", str(args.forks), "--json"]
            print(HEADER)
            total_wrong = 0
            plan = [(f"status #{r + 1}", ["status", *where]) for r in range(args.status_reps)]
            plan += [("post-extraction", ["run", "post-extraction", *where, "--no-record",
                                          "-e", "grace=1"]),
                     ("status after", ["status", *where])]
            for label, argv in [] if args.skip_direct else plan:
                if args.table and label == "post-extraction":
                    table_run(fleet, where[:-1])
                total_wrong += classified(fleet, label, argv, names, slow)
            if args.watch:
                watch_runs(fleet, where[:-1], args.watch)
            if args.bastion:
                total_wrong += bastion_runs(fleet, Path(tmp), args.forks, slow)
    return 1 if total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
