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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from report import Row, Sample, render, run_measured, write_results

from fleetclean.sim import SimFleet

ROOT = Path(__file__).resolve().parent.parent
FLEETCLEAN = [str(ROOT / ".venv" / "bin" / "fleetclean")]
SUBNET = 91  # away from the default fleet (0), sim_up.py (90) and test fleets (100..249)
PEER_VENV = Path("/tmp/fleetclean-bench-venv")
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
    baseline: Path | None = None
    baseline_ref: str = ""

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
    st_cpu = Sample(wall=[c / b.big for c in st.cpu])
    rows.append(Row("5", f"status, {b.big} nodes: controller CPU per host", st_cpu,
                    target="<= 6 ms", check=lambda _r: st_cpu.med() <= 0.006))

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
                    target="<= 8 ms", check=lambda _r: cpu.med() <= 0.008))
    rows.append(Row("5", f"post-extraction, {b.big} nodes: controller peak RSS (MiB)",
                    Sample(wall=scale[b.big].rss_mib)))
    return rows


def baseline_tree(ref: str, dest: Path) -> Path:
    """fleetclean as of git ``ref``, unpacked under ``dest`` (with its bytecode), for
    ``python -m fleetclean`` with PYTHONPATH pointing there."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "fleetclean"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)], check=True)
    return dest


def cpu_vs_baseline(b: Bench) -> list[Row]:
    """5. Controller CPU per host, this tree against ``--baseline REF``, interleaved: the
    same nodes, workloads and load for both; both started as ``python -m fleetclean``."""
    assert b.baseline is not None
    print(f"5. controller CPU on {b.big} nodes vs {b.baseline_ref}...", file=sys.stderr,
          flush=True)
    trees = {"this tree": str(ROOT), f"baseline {b.baseline_ref}": str(b.baseline)}
    status = {k: Sample() for k in trees}
    teardown = {k: Sample() for k in trees}
    inv = str(b.inv[b.big])
    for _ in range(b.reps):
        for label, tree in trees.items():
            env = dict(b.env, PYTHONPATH=tree)
            cmd = [sys.executable, "-m", "fleetclean"]
            spawn_all(b.fleet, b.names[:b.big])
            _w, c, _r, _o = run_measured([*cmd, "status", "-i", inv], env=env,
                                         ok=lambda rc, o: rc in (0, 1))
            status[label].wall.append(c / b.big)
            _w, c, r, _o = run_measured([*cmd, "run", "post-extraction", "-i", inv], env=env)
            teardown[label].wall.append(c / b.big)
            teardown[label].rss_mib.append(r)
    rows = []
    for what, samples, target in (("status", status, 0.006),
                                  ("post-extraction", teardown, 0.008)):
        ours, base = samples["this tree"], samples[f"baseline {b.baseline_ref}"]
        rows.append(Row("5", f"{what}, {b.big} nodes: controller CPU per host", ours, base,
                        f"baseline {b.baseline_ref}", f"<= {target * 1000:.0f} ms",
                        lambda _r, t=target, s=ours: s.med() <= t))
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
    ap.add_argument("--baseline", metavar="REF",
                    help="also controller CPU per host of git REF's fleetclean, same run")
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
        if args.baseline:
            b.baseline_ref = args.baseline
            b.baseline = baseline_tree(args.baseline, tmp / "baseline")
        # warm caches (page cache for python, sshd binaries) once
        run_measured(fc("status", "-i", str(b.inv[b.big])), env=env,
                     ok=lambda rc, o: rc in (0, 1))
        for section, step in (("seeds", one_node), ("status", status_vs_peers),
                              ("scale", scaling)):
            if section not in args.skip:
                rows += step(b)
        if b.baseline is not None:
            rows += cpu_vs_baseline(b)
    finally:
        fleet.down()
        shutil.rmtree(tmp, ignore_errors=True)

    table = render(rows, reps, seed_reps, time.monotonic() - started)
    print(table)
    if args.write:
        write_results(table)
    return 0




if __name__ == "__main__":
    raise SystemExit(main())
