"""Where a status script's wall time goes on this machine: its commands on a time line.

Run as root on a machine with a real ``nvidia-smi`` (read-only: the status playbook signals
nothing): ``.venv/bin/python benchmarks/timeline.py [--runs 15]``. Renders the status script
for this machine (``fleetclean show status --local``) as for a host never seen and, where
nvidia-smi lists compute apps, as for a host whose last status named them ("seen in use":
results/lastclean.py), and runs each as sshd has it run (``transport.boot``'s command,
the script on its standard input: ``node_status.py``'s harness), ``--runs`` times with
bash's xtrace on (``SHELLOPTS``; ``-x`` for the script's own privileged bash) and its trace
written, a line per command, to a pipe whose reader stamps each line as it arrives. xtrace
slows the script (each traced command one ``write``), so its figures are the trace's, not
the script's: what they show is the shape, where the time is spent between the script's
start, its nvidia-smi's start and answer, and its end. The same runs without the trace
and the bare query (``--query-gpu``, what pdsh runs) are timed beside it.

Per script it prints the median time from the run's start to the first traced command,
to the first command naming nvidia-smi, to the first command after the GPU read is taken
(``fc_smi_take``), and to the last command, with the slowest gaps between two consecutive
traced commands (the median over the runs of each gap, keyed by the command before it).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from node_status import BARE, boot_command, gpu_processes, local, render

XTRACE_FD = 7
HARNESS = 'eval "$BOOT" <<<"$S"'


def traced(script: str, boot: str) -> tuple[float, list[tuple[float, str]]]:
    """One run with xtrace: (wall seconds, [(seconds since the start, traced line)])."""
    read, write = os.pipe()
    lines: list[tuple[float, str]] = []

    def stamp() -> None:
        with os.fdopen(read, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                now = time.perf_counter()
                pending += chunk
                *whole, pending = pending.split(b"\n")
                lines.extend((now, w.decode(errors="replace")) for w in whole)

    reader = threading.Thread(target=stamp)
    reader.start()
    # The script's bash starts privileged (-p), which takes no SHELLOPTS from its
    # environment: it is given -x itself.
    env = {**os.environ, "S": script, "BOOT": boot.replace("bash --norc -p -c",
                                                          "bash --norc -p -x -c"),
           "SHELLOPTS": "xtrace", "BASH_XTRACEFD": str(XTRACE_FD)}
    os.dup2(write, XTRACE_FD)
    os.close(write)
    started = time.perf_counter()
    try:
        subprocess.run(["bash", "-c", HARNESS], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, pass_fds=(XTRACE_FD,), check=False)
        took = time.perf_counter() - started
    finally:
        os.close(XTRACE_FD)
    reader.join()
    return took, [(t - started, line) for t, line in lines]


def plain(command: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    return time.perf_counter() - started


def marks(line_times: list[tuple[float, str]]) -> dict[str, float]:
    """When the run reached each mark (seconds): its first traced command, the first naming
    nvidia-smi, the first after the GPU read was taken, its last."""
    found: dict[str, float] = {}
    if not line_times:
        return found
    found["first command"] = line_times[0][0]
    taking = False
    for t, line in line_times:
        if "nvidia-smi" in line and "nvidia-smi started" not in found:
            found["nvidia-smi started"] = t
        if "fc_smi_take" in line:
            taking = True
        elif taking and "GPU read taken" not in found and "fc_smi_read" not in line:
            found["GPU read taken"] = t
    found["last command"] = line_times[-1][0]
    return found


def report(name: str, script: str, boot: str, runs: int, dump: Path | None) -> None:
    env = {**os.environ, "S": script, "BOOT": boot}
    walls, bare, times = [], [], []
    traces: list[list[tuple[float, str]]] = []
    gaps: dict[str, list[float]] = defaultdict(list)
    at: dict[str, list[float]] = defaultdict(list)
    for _ in range(runs):
        walls.append(plain(["bash", "-c", HARNESS], env))
        bare.append(plain(["bash", "-c", BARE]))
        took, line_times = traced(script, boot)
        times.append(took)
        traces.append(line_times)
        for mark, t in marks(line_times).items():
            at[mark].append(t)
        for (t0, line), (t1, _) in itertools.pairwise(line_times):
            gaps[line.strip()[:110]].append(t1 - t0)
    ms = 1000
    print(f"== {name}: {runs} runs; medians: untraced {statistics.median(walls) * ms:.1f} ms, "
          f"bare query through bash -c {statistics.median(bare) * ms:.1f} ms, traced "
          f"{statistics.median(times) * ms:.1f} ms")
    for mark, ts in at.items():
        print(f"   {mark:20} at {statistics.median(ts) * ms:7.2f} ms (traced)")
    slow = sorted(gaps.items(), key=lambda kv: -sum(kv[1]) / runs)[:15]
    print("   slowest gaps (ms a run, the command before the gap):")
    for line, xs in slow:
        print(f"   {sum(xs) / runs * ms:7.2f}  x{len(xs) / runs:.1f}  {line}")
    if dump is not None:
        # The run whose traced wall is the median, whole: a line per traced command, the
        # time it was stamped and the gap before the next.
        median = sorted(range(runs), key=times.__getitem__)[runs // 2]
        lines = traces[median]
        dump.mkdir(parents=True, exist_ok=True)
        out = dump / (name.split(" (", maxsplit=1)[0].replace(" ", "-") + ".trace")
        with out.open("w") as f:
            for (t0, line), nxt in itertools.zip_longest(lines, lines[1:]):
                gap = (nxt[0] - t0) * ms if nxt else 0.0
                f.write(f"{t0 * ms:8.2f} {gap:6.2f}  {line[:200]}\n")
        print(f"   the median run's trace: {out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--dump", type=Path, help="write the median run's whole trace here (a folder)")
    args = ap.parse_args()
    scripts = {"never seen": render(args, ["--local"])}
    apps = gpu_processes(local)
    if apps:
        scripts["seen in use"] = render(args, ["--local"], named=apps)
    for name, text in scripts.items():
        report(name, text, boot_command(text), args.runs, args.dump)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
