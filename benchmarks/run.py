"""fleetclean against the seeds, the floor and the usual fleet tools, on a simulated fleet.

Run as root on Linux: ``scripts/dev bench [--quick] [--reps N] [--write]``. It brings up its
own simulated fleet on loopback (127.91.x.y), installs what the peers need (``pdsh`` via
apt-get when missing; ``ansible-core`` and ``parallel-ssh`` in a throwaway venv under /tmp),
measures every line of the table in this one run and stops the fleet before it exits.

Every time is a median over repetitions with min and max; a ratio is peer median divided by
fleetclean median (above 1: fleetclean is faster). The seed commands really sleep 14 s and
about 5 s, so they get fewer repetitions (``--seed-reps``). ``--write`` also puts the table
and the machine into benchmarks/RESULTS.md, between its ``bench:begin``/``bench:end`` marks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetclean.sim import SimFleet

ROOT = Path(__file__).resolve().parent.parent
FLEETCLEAN = [str(ROOT / ".venv" / "bin" / "fleetclean")]
SUBNET = 91  # away from the default fleet (0), sim_up.py (90) and test fleets (100..249)
PEER_VENV = Path("/tmp/fleetclean-bench-venv")
TIMEOUT_S = 180
QUERY = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total "
    "--format=csv,noheader,nounits"
)
SEED_000 = (
    "pkill -f 'sglang.launch_server'; sleep 3; pkill -9 -f sglang; sleep 3; pkill -9 python3; "
    "sleep 3; fuser -k /dev/nvidia* 2>/dev/null; sleep 5; "
    "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader"
)
SEED_001 = (
    'pkill -f "sglang" 2>/dev/null; sleep 2; ps aux | grep python3 | grep -v grep | '
    'awk "{print \\$2}" | xargs -r kill -9 2>/dev/null; sleep 1; fuser -k /dev/nvidia* '
    '2>/dev/null; sleep 2; nvidia-smi | grep -E "MiB|python" | head -20'
)
KEX = "-o KexAlgorithms=curve25519-sha256"
# Inside a node: SIGTERM every process of the workload, then read nvidia-smi until every
# GPU shows 0 MiB; prints the microseconds from the signal to that read.
FLOOR_SH = r"""
t0=${EPOCHREALTIME/./}
kill -TERM "$@"
while :; do
    s=0
    while IFS= read -r u; do s=$((s + u)); done < <(nvidia-smi --query-gpu=memory.used \
        --format=csv,noheader,nounits)
    ((s == 0)) && break
done
echo $(( ${EPOCHREALTIME/./} - t0 ))
"""
PSSH_PY = r"""
import json, sys
from pssh.clients import ParallelSSHClient
hosts, key, cmd, script = json.loads(sys.argv[1])
client = ParallelSSHClient(hosts, user="root", pkey=key, pool_size=len(hosts), timeout=60)
output = client.run_command(cmd)
if script is not None:
    data = open(script).read()
    for h in output:
        h.stdin.write(data)
        h.stdin.flush()
        h.stdin._client.eagain(h.channel.send_eof)  # EOF: bash -s runs the script, exits
client.join(output)
bad = 0
for h in output:
    n = sum(1 for _ in h.stdout)
    if h.exit_code != 0 or n == 0:
        bad += 1
        print(h.host, h.exit_code, h.exception, file=sys.stderr)
sys.exit(1 if bad else 0)
"""


@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)

    def med(self) -> float:
        return statistics.median(self.wall)

    def cell(self) -> str:
        if not self.wall:
            return "n/a"
        w = self.wall
        return f"{self.med():.3f} s ({min(w):.3f}-{max(w):.3f}, n={len(w)})"


def run_measured(argv: Sequence[str], *, env: dict[str, str] | None = None,
                 ok: Callable[[int, str], bool] | None = None,
                 stdin: Any = None) -> tuple[float, float, float, str]:
    """(wall s, user+sys s, peak RSS MiB, stdout) of one command we start, its CPU time and
    peak RSS from wait4; raises when ``ok`` (default: exit 0) says it failed."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if stdin is None else stdin,
                                stdout=out, stderr=err, env=env)
        # our own child, by PID, if it hangs
        timer = threading.Timer(TIMEOUT_S, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace")
        if not (ok or (lambda rc, _o: rc == 0))(proc.returncode, text):
            raise RuntimeError(
                f"{' '.join(argv[:4])}... exit {proc.returncode}: {err.read().decode()[-2000:]}"
            )
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text


def machine() -> str:
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor() or "?")
    mem = next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal"))
    ssh_v = subprocess.run(["ssh", "-V"], check=False, capture_output=True, text=True)
    ssh_v = ssh_v.stderr.strip()
    return (f"nproc {os.cpu_count()}, memory {int(mem) / 1024 / 1024:.1f} GiB, kernel "
            f"{platform.release()}, CPU {cpu}, Python {platform.python_version()}, {ssh_v}")


def ensure_peers(quiet: bool) -> None:
    if shutil.which("pdsh") is None:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "pdsh"], check=True, env=env)
    py = PEER_VENV / "bin" / "python"
    if not (PEER_VENV / "bin" / "ansible").exists() or subprocess.run(
            [str(py), "-c", "import pssh.clients"], check=False, capture_output=True).returncode:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "ansible-core", "parallel-ssh"],
                       check=True)


def subset_inventory(fleet: SimFleet, n: int, dest: Path) -> Path:
    data = yaml.safe_load(fleet.inventory_path.read_text())
    names = [node.name for node in fleet.nodes[:n]]
    data["all"]["hosts"] = {k: v for k, v in data["all"]["hosts"].items() if k in names}
    data["all"]["children"]["sim"]["hosts"] = {k: None for k in names}
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def spawn_all(fleet: SimFleet, names: Sequence[str]) -> dict[str, list[int]]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        pids = list(pool.map(lambda n: fleet.spawn(n, "sglang"), names))
    return dict(zip(names, pids, strict=True))


@dataclass
class Row:
    section: str
    what: str
    ours: Sample
    peer: Sample | None = None
    peer_name: str = ""
    target: str = ""
    check: Callable[[float], bool] | None = None  # on the ratio
    inverse: bool = False  # ratio is our median / peer median (the floor)

    def ratio(self) -> float | None:
        if self.peer is None or not self.peer.wall or not self.ours.wall:
            return None
        if self.inverse:
            return self.ours.med() / self.peer.med()
        return self.peer.med() / self.ours.med()


@dataclass
class Bench:
    """One benchmark invocation: the fleet, the inventories of each size and the peers."""

    fleet: SimFleet
    tmp: Path
    env: dict[str, str]
    sizes: list[int]
    reps: int
    seed_reps: int
    quick: bool
    inv: dict[int, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.big = max(self.sizes)
        self.cfg = str(self.fleet.ssh_config_path)
        self.names = [n.name for n in self.fleet.nodes]
        self.inv = {n: subset_inventory(self.fleet, n, self.tmp / f"inv{n}.yaml")
                    for n in self.sizes}
        self.inv1 = subset_inventory(self.fleet, 1, self.tmp / "inv1.yaml")
        self.peer_py = str(PEER_VENV / "bin" / "python")
        self.pssh_py = self.tmp / "pssh_run.py"
        self.pssh_py.write_text(PSSH_PY)
        self.addrs = [n.address for n in self.fleet.nodes[: self.big]]
        self.key = str(self.fleet.client_key_path)


def fc(*argv: str) -> list[str]:
    return [*FLEETCLEAN, *argv]


def one_node(b: Bench) -> list[Row]:
    """1. One node: fleetclean against the seeds and the floor."""
    rows: list[Row] = []
    print("1. one node: fleetclean, floor, seeds...", file=sys.stderr, flush=True)
    one, ssh_true, to_zero, s000, s001 = Sample(), Sample(), Sample(), Sample(), Sample()
    for _ in range(b.reps):
        b.fleet.spawn(b.names[0], "sglang")
        w, _c, _r, _o = run_measured(fc("run", "post-extraction", "-i", str(b.inv1)), env=b.env)
        one.wall.append(w)
        w, *_ = run_measured(["ssh", "-F", b.cfg, b.names[0], "true"])
        ssh_true.wall.append(w)
        pids = b.fleet.spawn(b.names[0], "sglang")
        done = b.fleet.run_in(b.names[0], ["bash", "-c", FLOOR_SH, "floor", *map(str, pids)])
        to_zero.wall.append(int(done.stdout.strip()) / 1e6)
    for i in range(b.seed_reps):
        for sample, cmd, node in ((s000, SEED_000, b.names[1]), (s001, SEED_001, b.names[2])):
            b.fleet.spawn(node, "sglang")
            # Sent literally as the seeds do (ssh host "..."), pkill -f kills the
            # remote bash -c that carries the pattern: it returns at once (exit 255)
            # with every GPU still busy. Its text on stdin runs to the end.
            with tempfile.TemporaryFile() as fh:
                fh.write(cmd.encode())
                fh.seek(0)
                w, *_ = run_measured(["ssh", "-F", b.cfg, node, "bash -s"],
                                     ok=lambda rc, o: True, stdin=fh)
            sample.wall.append(w)
            left = b.fleet.gpu_used_mib(node)
            if any(left):
                print(f"  note: seed left {left} MiB on {node} (rep {i})", file=sys.stderr)
                run_measured(fc("run", "post-extraction", "-i",
                                str(b.fleet.inventory_path), "-l", node),
                             env=b.env, ok=lambda rc, o: True)
    floor = Sample(wall=[a + b for a, b in zip(ssh_true.wall, to_zero.wall, strict=True)])
    rows += [
        Row("1", "post-extraction, 1 node vs seed 000", one, s000, "seed 000 (ssh)",
            ">= 20x", lambda r: r >= 20),
        Row("1", "post-extraction, 1 node vs seed 001", one, s001, "seed 001 (ssh)",
            ">= 7x", lambda r: r >= 7),
        Row("1", "post-extraction, 1 node vs floor (ratio: fleetclean/floor)", one,
            floor, "floor: ssh true + signal->0 MiB", "<= 2x", lambda r: r <= 2,
            inverse=True),
        Row("1", "  floor part: ssh node true", ssh_true),
        Row("1", "  floor part: signal->0 MiB in node", to_zero),
    ]

    return rows


def status_vs_peers(b: Bench) -> list[Row]:
    """3. status on the big b.fleet against pdsh, ansible and parallel-ssh."""
    rows: list[Row] = []
    print(f"3. status on {b.big} nodes vs peers...", file=sys.stderr, flush=True)
    spawn_all(b.fleet, b.names[:b.big])
    st = Sample()
    peers: dict[str, Sample] = {k: Sample() for k in (
        "pdsh -R ssh (default kex)", "pdsh -R ssh (curve25519)",
        "ansible -m raw -f 64 (default kex)", "ansible -m raw -f 64 (curve25519)",
        "parallel-ssh")}
    hostlist = f"{b.names[0]},{','.join(b.names[1:b.big])}"
    ans_env = dict(b.env, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_LOCAL_TEMP=str(b.tmp),
                   ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="False")
    n_lines = lambda rc, o: rc == 0 and o.count("\n") >= 8 * b.big  # noqa: E731
    for _ in range(b.reps):
        w, c, r, _o = run_measured(fc("status", "-i", str(b.inv[b.big])), env=b.env,
                                   ok=lambda rc, o: rc in (0, 1))
        st.wall.append(w)
        st.cpu.append(c)
        st.rss_mib.append(r)
        for kex, label in (("", "default kex"), (KEX, "curve25519")):
            pe = dict(b.env, PDSH_SSH_ARGS=f"-F {b.cfg} -a -x {kex} %h".replace("  ", " "))
            w, *_ = run_measured(["pdsh", "-R", "ssh", "-f", str(b.big), "-w", hostlist,
                                  QUERY], env=pe, ok=n_lines)
            peers[f"pdsh -R ssh ({label})"].wall.append(w)
            ae = dict(ans_env, ANSIBLE_SSH_ARGS=f"-o ControlMaster=no {kex}".strip())
            w, *_ = run_measured(
                [str(PEER_VENV / "bin" / "ansible"), "all", "-i", str(b.inv[b.big]),
                 "-m", "raw", "-a", QUERY, "-f", str(b.big)], env=ae, ok=n_lines)
            peers[f"ansible -m raw -f 64 ({label})"].wall.append(w)
        w, *_ = run_measured([b.peer_py, str(b.pssh_py), json.dumps([b.addrs, b.key, QUERY, None])])
        peers["parallel-ssh"].wall.append(w)
    targets = {"pdsh -R ssh (curve25519)": (">= 1x", 1.0),
               "ansible -m raw -f 64 (default kex)": (">= 3x", 3.0),
               "ansible -m raw -f 64 (curve25519)": (">= 3x", 3.0),
               "parallel-ssh": (">= 1x", 1.0)}
    for name, sample in peers.items():
        t = targets.get(name)
        rows.append(Row("3", f"status, {b.big} nodes vs {name}", st, sample, name,
                        t[0] if t else "", (lambda r, x=t[1]: r >= x) if t else None))
    rows.append(Row("5", f"status, {b.big} nodes: controller CPU per host",
                    Sample(wall=[c / b.big for c in st.cpu])))

    return rows


def scaling(b: Bench) -> list[Row]:
    """2./4./5. post-extraction scaling, against parallel-ssh, and the controller's cost."""
    rows: list[Row] = []
    print("2./4./5. post-extraction scaling and vs parallel-ssh...", file=sys.stderr,
          flush=True)
    script = b.tmp / "post-extraction.sh"
    script.write_text(run_measured(fc("show", "post-extraction", "-i", str(b.inv[b.big]),
                                      "--host", b.names[0]), env=b.env)[3])
    scale = {n: Sample() for n in b.sizes}
    status_scale = {n: Sample() for n in b.sizes}
    pssh_pe = Sample()
    for _ in range(b.reps):
        for n in b.sizes:
            spawn_all(b.fleet, b.names[:n])
            # status of the busy nodes first (read-only), then their teardown
            w, *_ = run_measured(fc("status", "-i", str(b.inv[n])), env=b.env,
                                 ok=lambda rc, o: rc in (0, 1))
            status_scale[n].wall.append(w)
            w, c, r, _o = run_measured(fc("run", "post-extraction", "-i", str(b.inv[n])),
                                       env=b.env)
            scale[n].wall.append(w)
            scale[n].cpu.append(c)
            scale[n].rss_mib.append(r)
        spawn_all(b.fleet, b.names[:b.big])
        w, *_ = run_measured([b.peer_py, str(b.pssh_py),
                              json.dumps([b.addrs, b.key, "bash -s", str(script)])])
        pssh_pe.wall.append(w)
        left = [x for n in b.names[:b.big] for x in b.fleet.gpu_used_mib(n) if x]
        if left:
            print(f"  note: parallel-ssh run left {len(left)} busy GPUs", file=sys.stderr)
    for n in b.sizes:
        rows.append(Row("2", f"post-extraction, {n} nodes", scale[n]))
    for n in b.sizes:
        rows.append(Row("2", f"status, {n} busy nodes", status_scale[n]))
    rows.append(Row("4", f"post-extraction, {b.big} nodes vs parallel-ssh (same script)",
                    scale[b.big], pssh_pe, "parallel-ssh", ">= 1x", lambda r: r >= 1))
    cpu = Sample(wall=[c / b.big for c in scale[b.big].cpu])
    rows.append(Row("5", f"post-extraction, {b.big} nodes: controller CPU per host", cpu,
                    target="<= 10 ms", check=None))
    rows.append(Row("5", f"post-extraction, {b.big} nodes: controller peak RSS (MiB)",
                    Sample(wall=scale[b.big].rss_mib)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repetitions, 1 per seed, ~4 min")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5)")
    ap.add_argument("--seed-reps", type=int, default=None, help="seed repetitions (default 3)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    ap.add_argument("--skip", nargs="*", default=[], choices=["seeds", "status", "scale"],
                    help="sections to leave out")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 5)
    seed_reps = args.seed_reps or (1 if args.quick else 3)
    if os.geteuid() != 0:
        print("benchmarks/run.py: run as root (the simulated b.fleet needs namespaces)",
              file=sys.stderr)
        return 4
    ensure_peers(args.quick)
    # a TERM (timeout, CI) must still take the fleet down: finally runs on SystemExit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    rows: list[Row] = []
    tmp = Path(tempfile.mkdtemp(prefix="fleetclean-bench-"))
    nodes_needed = max(*args.sizes, 3)
    print(f"bringing up {nodes_needed} simulated nodes...", file=sys.stderr, flush=True)
    fleet = SimFleet.up(nodes_needed, tmp / "fleet", subnet=SUBNET)
    try:
        (tmp / "home").mkdir()
        env = dict(os.environ, NO_COLOR="1", FLEETCLEAN_STATE_DIR=str(tmp / "state"),
                   HOME=str(tmp / "home"))
        b = Bench(fleet, tmp, env, args.sizes, reps, seed_reps, args.quick)
        # warm caches (page cache for python, sshd binaries) once
        run_measured(fc("status", "-i", str(b.inv[b.big])), env=env,
                     ok=lambda rc, o: rc in (0, 1))
        for section, step in (("seeds", one_node), ("status", status_vs_peers),
                              ("scale", scaling)):
            if section not in args.skip:
                rows += step(b)
    finally:
        fleet.down()
        shutil.rmtree(tmp, ignore_errors=True)

    table = render(rows, reps, seed_reps, time.monotonic() - started)
    print(table)
    if args.write:
        write_results(table)
    return 0


def render(rows: list[Row], reps: int, seed_reps: int, took: float) -> str:
    lines = [
        f"Machine: {machine()}",
        f"Repetitions: {reps} (seeds: {seed_reps}); whole run {took:.0f} s; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        "| # | measurement | fleetclean median (min-max) | peer median (min-max) "
        "| ratio peer/fleetclean | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ratio = row.ratio()
        ours = row.ours.cell()
        if "CPU per host" in row.what:
            w = row.ours.wall
            lo, hi = min(w) * 1000, max(w) * 1000
            ours = f"{statistics.median(w) * 1000:.2f} ms ({lo:.2f}-{hi:.2f})"
            met = "yes" if statistics.median(w) <= 0.010 else "no"
        elif "RSS" in row.what:
            w = row.ours.wall
            ours = f"{statistics.median(w):.0f} MiB ({min(w):.0f}-{max(w):.0f})"
            met = ""
        else:
            met = ""
            if row.check is not None and ratio is not None:
                met = "yes" if row.check(ratio) else "no"
        ratio_s = "" if ratio is None else f"{ratio:.2f}x"
        peer = "" if row.peer is None else f"{row.peer_name}: {row.peer.cell()}"
        lines.append(f"| {row.section} | {row.what} | {ours} | {peer} | {ratio_s} "
                     f"| {row.target} | {met} |")
    return "\n".join(lines)


def write_results(table: str) -> None:
    path = ROOT / "benchmarks" / "RESULTS.md"
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    text = path.read_text() if path.exists() else f"# Benchmark results\n\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}")


if __name__ == "__main__":
    raise SystemExit(main())
