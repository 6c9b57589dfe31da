"""fleetclean against pdsh and parallel-ssh from 1 to 1,000 nodes, in one invocation.

Run as root on Linux: ``.venv/bin/python benchmarks/peers.py [--sizes 1 8 64 256 1000]
[--reps 3] [--busy 0.1] [--forks 64] [--profile [status] [post-extraction]]``. One simulated
fleet of the biggest size, an SGLang tp8 server on ``--busy`` of its nodes (spread evenly);
each size is the first N nodes. Per size and repetition, interleaved so that load drifts
hit every tool alike:

- ``fleetclean status`` (the table, as a person runs it), ``pdsh -R ssh`` with
  curve25519 (what paramiko negotiates) and parallel-ssh, both running
  ``nvidia-smi --query-gpu=index,memory.used --format=csv,noheader``;
- ``fleetclean run post-extraction`` and parallel-ssh sending the same rendered script to
  ``bash -s``; the busy nodes are made busy again after each (not timed).

Every tool gets the same fan-out (``--forks``). For fleetclean it also reports the CPU
per host (user+sys of that one child from ``os.wait4``: the simulated nodes' CPU is not
in it), its peak RSS, and its peak threads and open fds (``/proc/PID/status`` and
``/proc/PID/fd`` sampled every 10 ms). Ratios are peer median / fleetclean median (above 1:
fleetclean faster), min/median/max over the repetitions. Each command's whole CPU bill is
printed too: the machine's busy time from ``/proc/stat`` while it ran, the simulated nodes'
sshd and remote commands included, per host, and split into the tool's own process tree
(pdsh with its ssh clients; ``wait4``) and the rest, the nodes' share (with this script's
own sampling of the tool's threads and fds, about 0.2 ms a host, and anything else
running). ``--profile``: one more ``status`` (or each run named: ``status``,
``post-extraction``) at the biggest size under cProfile (every thread's CPU, merged), its
top functions printed. ``--rtt SECONDS``: every node behind the simulator's latency proxy
(``sim fault NODE latency``), as a fleet reached from a laptop across a VPN: what the
round trips each tool needs a host cost the fleet. The nodes share
this machine's cores with the controller and the peers.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from run import PEER_VENV, ensure_peers, subset_inventory
from scale import Peaks, free_subnet

from fleetclean.sim import SimFleet
from fleetclean.sim.cli import busy_nodes

ROOT = Path(__file__).resolve().parent.parent
FLEETCLEAN = str(ROOT / ".venv" / "bin" / "fleetclean")
QUERY = "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader"
KEX = "-o KexAlgorithms=curve25519-sha256"
BIG = 1000
PSSH_PY = r"""
import json, sys
from pssh.clients import ParallelSSHClient
hosts, key, pool, cmd, script = json.loads(sys.argv[1])
client = ParallelSSHClient(hosts, user="root", pkey=key, pool_size=pool, timeout=120)
output = client.run_command(cmd)
if script is not None:
    data = open(script).read()
    for h in output:
        h.stdin.write(data)
        h.stdin.flush()
        h.stdin._client.eagain(h.channel.send_eof)  # EOF: bash -s runs the script, exits
client.join(output)
bad = [(h.host, h.exit_code, repr(h.exception), list(h.stderr)[-2:]) for h in output
       if h.exit_code != 0 or not list(h.stdout)]
sys.exit(f"parallel-ssh: {len(bad)} hosts failed: {bad[:3]}" if bad else 0)
"""


# cProfile sees one thread; the hosts run in threads (a pool, paramiko's transport
# threads). One profile per thread, merged: where the controller's CPU goes.
PROFILE_PY = r"""
import cProfile, pstats, sys, threading, time
profiles = []
inner = threading.Thread._bootstrap_inner
def bootstrap(self):
    prof = cProfile.Profile(time.thread_time)  # this thread's CPU, not its waits
    profiles.append(prof)
    prof.enable()
    try:
        inner(self)
    finally:
        prof.disable()
threading.Thread._bootstrap_inner = bootstrap
main = cProfile.Profile(time.thread_time)
profiles.append(main)
from fleetclean.cli import main as cli
main.enable()
try:
    cli(sys.argv[2:])
except SystemExit:
    pass
main.disable()
stats = pstats.Stats(*profiles[:1])
for prof in profiles[1:]:
    stats.add(prof)
stats.dump_stats(sys.argv[1])
"""


@dataclass
class Runs:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    machine: list[float] = field(default_factory=list)
    failed: int = 0


TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    """Seconds of CPU this machine's cores have spent busy since boot (/proc/stat): every
    process's, the simulated nodes' (sshd, bash, nvidia-smi) with the tool's own."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    # Steal (the eighth) is time the hypervisor gave to other guests: not this machine's work.
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / TICK


def timed(argv: list[str], runs: Runs, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> None:
    """Run once; wall, CPU and peak RSS from wait4, threads and fds sampled."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        busy = machine_cpu()
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        peaks = Peaks(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        peaks.stop()
        runs.wall.append(time.perf_counter() - started)
        runs.machine.append(machine_cpu() - busy)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if code not in ok:  # a peer's failure is a figure too: said, and the run goes on
            runs.failed += 1
            print(f"  note: {' '.join(argv[:2])}...: exit {code}: "
                  f"{err.read().decode()[-600:]}", flush=True)
    runs.cpu.append(usage.ru_utime + usage.ru_stime)
    runs.rss.append(usage.ru_maxrss / 1024)
    runs.threads.append(peaks.threads)
    runs.fds.append(peaks.fds)


def spread(xs: list[float], scale: float = 1.0, digits: int = 2) -> str:
    return (f"{statistics.median(xs) * scale:.{digits}f} "
            f"({min(xs) * scale:.{digits}f}-{max(xs) * scale:.{digits}f})")


class Bench:
    def __init__(self, fleet: SimFleet, tmp: Path, args: argparse.Namespace) -> None:
        self.fleet, self.tmp, self.args = fleet, tmp, args
        self.names = [n.name for n in fleet.nodes]
        self.busy = set(busy_nodes(self.names, args.busy))
        (tmp / "home").mkdir()
        self.env = dict(os.environ, NO_COLOR="1", FLEETCLEAN_STATE_DIR=str(tmp / "state"),
                        HOME=str(tmp / "home"))
        self.pssh = tmp / "pssh_run.py"
        self.pssh.write_text(PSSH_PY)
        self.cfg = str(fleet.ssh_config_path)

    def refill(self, n: int) -> None:
        """Make the busy nodes among the first ``n`` busy again (after a teardown)."""
        self.fleet.spawn_all([m for m in self.names[:n] if m in self.busy], "sglang")

    def fc(self, inv: Path, *argv: str) -> list[str]:
        return [FLEETCLEAN, *argv, "-i", str(inv), "-f", str(self.args.forks)]

    def pssh_argv(self, n: int, cmd: str, script: Path | None) -> list[str]:
        addrs = [node.address for node in self.fleet.nodes[:n]]
        spec = [addrs, str(self.fleet.client_key_path), self.args.forks, cmd,
                None if script is None else str(script)]
        return [str(PEER_VENV / "bin" / "python"), str(self.pssh), json.dumps(spec)]

    def size(self, n: int) -> dict[str, Runs]:
        inv = subset_inventory(self.fleet, n, self.tmp / f"inv{n}.yaml")
        script = self.tmp / f"pe{n}.sh"
        script.write_text(subprocess.run(
            [FLEETCLEAN, "show", "post-extraction", "-i", str(inv), "--host", self.names[0]],
            capture_output=True, text=True, check=True, env=self.env).stdout)
        hosts = ",".join(self.names[:n])
        pdsh_env = dict(self.env, PDSH_SSH_ARGS=f"-F {self.cfg} -a -x {KEX} %h")
        runs = {k: Runs() for k in ("status", "pdsh", "pssh", "post-extraction", "pssh pe")}
        reps = self.args.reps_big if n >= BIG and self.args.reps_big else self.args.reps
        for _ in range(reps):
            timed(self.fc(inv, "status"), runs["status"], self.env, ok=(0, 1))
            timed(["pdsh", "-R", "ssh", "-f", str(self.args.forks), "-w", hosts, QUERY],
                  runs["pdsh"], pdsh_env)
            timed(self.pssh_argv(n, QUERY, None), runs["pssh"], self.env)
            timed(self.fc(inv, "run", "post-extraction", "--no-record"),
                  runs["post-extraction"], self.env)
            self.refill(n)
            timed(self.pssh_argv(n, "bash -s", script), runs["pssh pe"], self.env)
            self.refill(n)
        return runs

    def profile(self, n: int, what: str) -> None:
        """Where a run's CPU goes at ``n`` hosts: every thread's profile, merged."""
        inv = self.tmp / f"inv{n}.yaml"
        out = self.tmp / "run.prof"
        argv = ["status"] if what == "status" else ["run", what, "--no-record"]
        subprocess.run([sys.executable, "-c", PROFILE_PY, str(out), *argv, "-i", str(inv),
                        "-f", str(self.args.forks)], env=self.env, capture_output=True,
                       check=False)
        if what != "status":
            self.refill(n)  # what the teardown stopped
        print(f"--- profile: {what} at {n} hosts, every thread's CPU, by own time")
        pstats.Stats(str(out)).sort_stats("tottime").print_stats(22)
        print("--- by cumulative time")
        pstats.Stats(str(out)).sort_stats("cumulative").print_stats(22)


def report(n: int, runs: dict[str, Runs]) -> None:
    st, pe = runs["status"], runs["post-extraction"]
    for label, ours, peer in (("status vs pdsh (curve25519)", st, runs["pdsh"]),
                              ("status vs parallel-ssh", st, runs["pssh"]),
                              ("post-extraction vs parallel-ssh", pe, runs["pssh pe"])):
        ratios = [p / o for p, o in zip(peer.wall, ours.wall, strict=True)]
        failed = f" ({ours.failed} fleetclean, {peer.failed} peer runs failed)" if (
            ours.failed or peer.failed) else ""
        print(f"{n:>5}  {label:<32} fleetclean {spread(ours.wall)} s  peer "
              f"{spread(peer.wall)} s  ratio {spread(ratios)}x{failed}", flush=True)
    for label, r in (("status", st), ("post-extraction", pe)):
        print(f"{n:>5}  {label} controller: CPU {spread(r.cpu, 1000 / n)} ms/host, peak RSS "
              f"{spread(r.rss, digits=0)} MiB, peak threads {max(r.threads)}, peak fds "
              f"{max(r.fds)}", flush=True)
    # The whole bill: the nodes share this machine's cores, so what a tool makes them do
    # (sshd, the remote command) is paid on the same cores as the tool itself.
    bill = "  ".join(f"{name} {spread(runs[key].machine, 1000 / n, 1)}" for name, key in (
        ("status", "status"), ("pdsh", "pdsh"), ("parallel-ssh", "pssh"),
        ("post-extraction", "post-extraction"), ("parallel-ssh script", "pssh pe")))
    print(f"{n:>5}  machine CPU ms/host (every process): {bill}", flush=True)
    # Split between the controller (the tool's process tree: pdsh with its ssh clients)
    # and the nodes (the rest of the machine's busy time: sshd, the remote command). On a
    # real fleet only the first is paid on one machine; the second runs on every node's
    # own cores, in parallel.
    names = (("status", "status"), ("pdsh", "pdsh"), ("parallel-ssh", "pssh"))
    tool = "  ".join(f"{name} {spread(runs[key].cpu, 1000 / n, 1)}" for name, key in names)
    rest = {key: [m - c for m, c in zip(runs[key].machine, runs[key].cpu, strict=True)]
            for _, key in names}
    nodes = "  ".join(f"{name} {spread(rest[key], 1000 / n, 1)}" for name, key in names)
    print(f"{n:>5}  controller CPU ms/host (the tool, with its children): {tool}", flush=True)
    print(f"{n:>5}  nodes' CPU ms/host (machine minus tool): {nodes}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 256, 1000])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--reps-big", type=int, default=0, metavar="N",
                    help=f"repetitions at {BIG} nodes and more (default: --reps)")
    ap.add_argument("--busy", type=float, default=0.1, metavar="F")
    ap.add_argument("--forks", type=int, default=64)
    ap.add_argument("--profile", nargs="*", choices=("status", "post-extraction"),
                    metavar="RUN", help="status (the default) and/or post-extraction")
    ap.add_argument("--rtt", type=float, default=0.0, metavar="SECONDS",
                    help="every node that far from the tools (sim fault latency): a fleet "
                         "reached from a laptop; the TCP handshake is not delayed")
    args = ap.parse_args()
    ensure_peers(True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the fleet still goes down
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fleetclean-peers-") as tmp, \
            SimFleet.up(max(args.sizes), Path(tmp) / "fleet", subnet=free_subnet()) as fleet:
        bench = Bench(fleet, Path(tmp), args)
        bench.refill(max(args.sizes))
        if args.rtt:
            for node in fleet.nodes:
                fleet.set_fault(node.name, "latency", args.rtt)
        far = f", every node {args.rtt:g} s of round trip away" if args.rtt else ""
        print(f"{max(args.sizes)} nodes up, {len(bench.busy)} busy (SGLang tp8), fan-out "
              f"{args.forks}, {args.reps} repetitions, nproc {os.cpu_count()}{far}",
              flush=True)
        for n in args.sizes:
            report(n, bench.size(n))
        for what in ([] if args.profile is None else args.profile or ["status"]):
            bench.profile(max(args.sizes), what)
    print(f"whole run {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
