"""Time from a job's end to its node idle again, with fleetclean's epilog and with the seeds'.

Run as root on Linux: ``.venv/bin/python benchmarks/epilog.py [--reps N] [--seed-reps N]
[--write]``. One simulated node with the fleet's real Slurm (slurmctld here, slurmd in the
node, proctrack/linuxproc). Every repetition, an ``sbatch`` job on all 8 GPUs starts an
SGLang-like server (``python3 -m sglang.launch_server --tp 8``, a scheduler per GPU, a
detokenizer) that daemonizes out of the job step, as servers left running do; the job then
ends, and the server is still there. Slurm runs ``Epilog=`` and keeps the node
``completing`` until it exits; the time measured is from the job's end (the moment it is
told to exit) to ``sinfo`` showing the node ``idle``.

The epilogs, each the only ``Epilog=`` in its runs (same node, same job, same run):

- fleetclean: ``fleetclean export slurm-epilog post-extraction`` as it ships;
- seed 000 and seed 001: the manual teardowns of ``../shared/seeds`` (``pkill -f sglang...;
  sleep 3; ...``), the text the engineer sent over ``ssh root@host "..."``, run as the epilog
  instead (with the PATH an SSH session has: slurmd gives an epilog none);
- none: ``exit 0``, what Slurm itself takes from job end to idle (the server is then left
  behind, busy GPUs and all, which is the problem).

``--write`` puts the table into benchmarks/RESULTS.md between its ``epilog:begin``/``end``
marks. Ratios are seed median / fleetclean median, from this one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import Sample, machine
from run import SEED_000, SEED_001

from fleetclean.sim import SimFleet
from fleetclean.sim import slurm as sim_slurm
from fleetclean.sim.layout import PACKAGE_DIR, node_python

ROOT = Path(__file__).resolve().parent.parent
SUBNET = 93  # away from run.py's 91 and the test fleets
EPILOG = Path("epilog/epilog")
NODE = "node01"
PATH_LINE = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"


def seed_epilog(seed: str) -> str:
    return f"#!/bin/bash\n# a seed's teardown, run by slurmd as the epilog\n{PATH_LINE}{seed}\n"


def job_script(go: str) -> str:
    """The job: start the server (it daemonizes: reparented away from the step, it outlives
    the job), then wait until told to end."""
    launch = f"{node_python()} {PACKAGE_DIR / 'launcher.py'} sglang '{{\"gpus\": \"0-7\"}}'"
    return f"#!/bin/sh\n{launch}\nwhile [ ! -e '{go}' ]; do sleep 0.02; done\n"


def state(fleet: SimFleet) -> str:
    return sim_slurm.node_states(fleet.state_dir).get(NODE, "")


def one_job(fleet: SimFleet, rep: str) -> float:
    """Seconds from telling the job to end to the node idle; raises if it never is."""
    node_dir = fleet.node(NODE).dir
    go = f"/run/fleetclean/go-{rep}"
    env = sim_slurm.slurm_env(fleet.state_dir)
    out = node_dir / f"job-{rep}.out"
    done = subprocess.run(["sbatch", "--parsable", "-w", NODE, "--gres=gpu:8", "-o",
                           f"/run/fleetclean/{out.name}", "--wrap", job_script(go)], env=env,
                          capture_output=True, text=True, check=True, cwd="/")
    job = done.stdout.strip()
    deadline = time.monotonic() + 60
    while not all(fleet.gpu_used_mib(NODE) or [0]):  # the server holds all 8
        if time.monotonic() > deadline:
            said = out.read_text() if out.exists() else "no output"
            raise RuntimeError(f"job {job}'s server never held the GPUs ({state(fleet)}; "
                               f"{fleet.gpu_used_mib(NODE)}): {said[-500:]}")
        time.sleep(0.05)
    t0 = time.perf_counter()
    (node_dir / f"go-{rep}").touch()
    while state(fleet) != "idle":
        if state(fleet).startswith("drain"):
            raise RuntimeError(f"{NODE} drained after job {job}: its epilog failed")
        if time.perf_counter() - t0 > 120:
            raise RuntimeError(f"{NODE} not idle 120 s after job {job} ended")
        time.sleep(0.02)
    return time.perf_counter() - t0


def clean_up(fleet: SimFleet, fleetclean: Path, env: dict[str, str]) -> None:
    """Whatever an epilog left (none leaves the server), so every job meets an idle node."""
    if any(fleet.gpu_used_mib(NODE)):
        subprocess.run([str(fleetclean), "run", "post-extraction", "-i",
                        str(fleet.inventory_path), "-l", NODE, "--no-record"],
                       env=env, capture_output=True, check=False)


def measure(fleet: SimFleet, epilogs: dict[str, str],
            reps: dict[str, int]) -> tuple[dict[str, Sample], dict[str, int]]:
    """Each epilog's times, and the most GPU memory (MiB) any of its runs left in use."""
    fleetclean = ROOT / ".venv" / "bin" / "fleetclean"
    env = dict(os.environ, NO_COLOR="1")
    path = fleet.shared_dir / EPILOG
    samples = {name: Sample() for name in epilogs}
    most_left = dict.fromkeys(epilogs, 0)
    for rep in range(max(reps.values())):
        # Interleaved, so that the machine's load drifts over every epilog alike.
        for name, text in epilogs.items():
            if rep >= reps[name]:
                continue
            path.write_text(text)
            path.chmod(0o755)
            samples[name].wall.append(one_job(fleet, f"{name.replace(' ', '')}-{rep}"))
            left = sum(fleet.gpu_used_mib(NODE))
            most_left[name] = max(most_left[name], left)
            print(f"  {name} rep {rep}: {samples[name].wall[-1]:.2f} s, left {left} MiB",
                  file=sys.stderr, flush=True)
            clean_up(fleet, fleetclean, env)
    return samples, most_left


def render(samples: dict[str, Sample], most_left: dict[str, int], took: float) -> str:
    ours = samples["fleetclean"]
    lines = [
        f"Machine: {machine()}",
        f"Whole run {took:.0f} s; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        "| epilog | job end -> node idle, median (min-max) | ratio to fleetclean "
        "| GPU memory left in use (most of any run) |",
        "| --- | --- | --- | --- |",
    ]
    for name, sample in samples.items():
        ratio = "" if name == "fleetclean" else f"{sample.med() / ours.med():.2f}x"
        lines.append(f"| {name} | {sample.cell()} | {ratio} | {most_left[name]} MiB |")
    return "\n".join(lines)


def write_results(table: str) -> None:
    path = ROOT / "benchmarks" / "RESULTS.md"
    begin, end = "<!-- epilog:begin -->", "<!-- epilog:end -->"
    text = path.read_text()
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="fleetclean and 'none' (default 5)")
    parser.add_argument("--seed-reps", type=int, default=3, help="each seed (default 3)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        print("needs Slurm (scripts/dev setup installs it)", file=sys.stderr)
        return 4
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fleetclean-epilog-bench-"))
    fleet = SimFleet.up(1, tmp / "fleet", subnet=SUBNET, slurm=True, slurm_epilog=EPILOG)
    try:
        ours = subprocess.run([str(ROOT / ".venv" / "bin" / "fleetclean"), "export",
                               "slurm-epilog", "post-extraction"], capture_output=True,
                              text=True, check=True).stdout
        epilogs = {"fleetclean": ours, "seed 000": seed_epilog(SEED_000),
                   "seed 001": seed_epilog(SEED_001), "none": "#!/bin/sh\nexit 0\n"}
        reps = {"fleetclean": args.reps, "seed 000": args.seed_reps,
                "seed 001": args.seed_reps, "none": args.reps}
        samples, most_left = measure(fleet, epilogs, reps)
    finally:
        fleet.down()
        shutil.rmtree(tmp, ignore_errors=True)
    table = render(samples, most_left, time.monotonic() - started)
    print(table)
    if args.write:
        write_results(table)
    print(f"fleetclean median {statistics.median(samples['fleetclean'].wall):.2f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
