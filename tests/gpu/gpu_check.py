"""Prove fleetclean on a real GPU, through the local connection (the GPU machine has no sshd).

Starts a CUDA process named like an SGLang server that holds tens of GiB, plus a child that
holds memory too, every command line carrying a unique marker; runs `fleetclean status`,
`fleetclean run --check`, then a teardown whose every stage matches only that marker; and
checks from real nvidia-smi that memory is back to the idle level and that fleetclean's table
says the same. Measures the time from the first signal to idle memory.

    python3 tests/gpu/gpu_check.py OUTDIR [--gib 40 --child-gib 8 --gpu 0]

Writes the raw nvidia-smi outputs and fleetclean's --json outputs into OUTDIR, and
summary.json with the figures; exits 0 only when every check held. It signals nothing but
the processes it started (by PID, at the end, if anything is left).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PLAYBOOK = HERE / "gpu-teardown.yaml"

QUERY_GPU = "index,uuid,name,memory.used,memory.total"
QUERY_APPS = "pid,process_name,used_memory,gpu_uuid,gpu_bus_id"


def smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=False)


def save_smi(out: Path, name: str, *args: str) -> str:
    done = smi(*args)
    (out / name).write_text(done.stdout + done.stderr + f"__rc={done.returncode}\n")
    return done.stdout


def used_mib() -> list[int]:
    done = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")
    return [int(v) for v in done.stdout.split()]


def fleetclean(out: Path, name: str, *args: str) -> tuple[int, dict[str, Any] | None, float]:
    env = dict(os.environ, NO_COLOR="1", FLEETCLEAN_STATE_DIR=str(out / "state"))
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "fleetclean", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, check=False)
    (out / name).write_text(done.stdout)
    if done.stderr:
        (out / (name + ".stderr")).write_text(done.stderr)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = None
    return done.returncode, data, t0


class Poller(threading.Thread):
    """Reads one GPU's used memory as fast as NVML (or nvidia-smi) allows."""

    def __init__(self, gpu: int) -> None:
        super().__init__(daemon=True)
        self.gpu = gpu
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.source = "nvidia-smi"
        self.read = self._nvml() or self._smi
        # NVML's "used" counts memory the driver reserves (about 600 MiB on an H200) that
        # nvidia-smi does not show: compare against this reader's own idle reading.
        self.idle = self.read()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.time(), self.read()))

    def _smi(self) -> int:
        return used_mib()[self.gpu]

    def _nvml(self) -> Any:
        try:
            import pynvml
        except ImportError:
            return None
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(self.gpu)
        self.source = "nvml"
        return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gib", type=float, default=40.0)
    ap.add_argument("--child-gib", type=float, default=8.0)
    ap.add_argument("--gpu", type=int, default=0)
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    marker = f"fcgpu-{uuid.uuid4().hex[:12]}"
    checks: dict[str, bool] = {}
    summary: dict[str, Any] = {"marker": marker, "checks": checks}

    save_smi(out, "plain_idle.txt")
    save_smi(out, "q_idle.txt", f"--query-gpu={QUERY_GPU}", "--format=csv,noheader,nounits")
    save_smi(out, "apps_idle.txt", f"--query-compute-apps={QUERY_APPS}",
             "--format=csv,noheader,nounits")
    idle = used_mib()
    summary["idle_mib"] = idle
    # An idle H200 reads 0 MiB; allow what was already used before we started.
    limit = max(idle)

    inventory = out / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    gpuhost:\n      ansible_connection: local\n")

    poller = Poller(args.gpu)
    tmp = out / "run"
    tmp.mkdir(exist_ok=True)
    ready, siglog = tmp / "ready", tmp / "signals"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(args.gpu))
    server = subprocess.Popen(
        [sys.executable, str(HERE / "holder.py"), "sglang.launch_server", "--marker", marker,
         "--gib", str(args.gib), "--child-gib", str(args.child_gib), "--ready", str(ready),
         "--signal-log", str(siglog)],
        env=env, start_new_session=True,
    )
    started = [server.pid]
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            if time.monotonic() > deadline or server.poll() is not None:
                print("holder did not become ready", file=sys.stderr)
                return 1
            time.sleep(0.1)
        child_pid = int((tmp / "ready.child").read_text()) if args.child_gib else None
        if child_pid:
            started.append(child_pid)
        time.sleep(0.5)
        held = used_mib()
        summary["held_mib"] = held
        save_smi(out, "plain_held.txt")
        save_smi(out, "q_held.txt", f"--query-gpu={QUERY_GPU}", "--format=csv,noheader,nounits")
        save_smi(out, "q_held_units.txt", f"--query-gpu={QUERY_GPU}", "--format=csv,noheader")
        save_smi(out, "apps_held.txt", f"--query-compute-apps={QUERY_APPS}",
                 "--format=csv,noheader,nounits")
        save_smi(out, "apps_held_units.txt", f"--query-compute-apps={QUERY_APPS}",
                 "--format=csv,noheader")
        checks["memory held while running"] = held[args.gpu] > limit + 1024 * args.gib * 0.9

        code, status, _ = fleetclean(out, "status_held.json", "status", "-i", str(inventory),
                                     "--json", "-e", f"max_used_mib={limit}")
        table_used = [g["memory_used_mib"] for g in (status or {"hosts": [{"gpus": []}]})
                      ["hosts"][0]["gpus"]]
        checks["status reports the held memory"] = (
            code == 1 and abs(table_used[args.gpu] - held[args.gpu]) <= 64
        )

        code, check, _ = fleetclean(out, "check.json", "run", str(PLAYBOOK), "-i",
                                    str(inventory), "-e", f"marker={marker}", "--check",
                                    "--json", "-e", f"max_used_mib={limit}")
        alive = [p for p in started if _alive(p)]
        checks["--check changed nothing"] = alive == started and check is not None and (
            check["hosts"][0]["signalled"] == []
        )

        poller.start()
        code, teardown, t_run = fleetclean(
            out, "teardown.json", "run", str(PLAYBOOK), "-i", str(inventory),
            "-e", f"marker={marker}", "-e", f"max_used_mib={limit}", "--json",
        )
        time.sleep(0.3)
        poller.stop.set()
        poller.join()
        after = used_mib()
        summary["after_mib"] = after
        save_smi(out, "plain_after.txt")
        save_smi(out, "q_after.txt", f"--query-gpu={QUERY_GPU}", "--format=csv,noheader,nounits")
        save_smi(out, "apps_after.txt", f"--query-compute-apps={QUERY_APPS}",
                 "--format=csv,noheader,nounits")

        host = (teardown or {"hosts": [{}]})["hosts"][0]
        checks["teardown exit 0, host clean"] = code == 0 and host.get("status") == "clean"
        checks["every started process is gone"] = not any(_alive(p) for p in started)
        checks["real nvidia-smi back to idle"] = after[args.gpu] <= limit
        table_after = [g["memory_used_mib"] for g in host.get("gpus", [])]
        checks["fleetclean's table agrees with nvidia-smi"] = table_after == after
        signalled = {s["pid"] for s in host.get("signalled", [])}
        checks["signalled only what this script started"] = signalled <= set(started)

        signals = sorted(float(line.split()[0]) for line in siglog.read_text().splitlines())
        first_signal = signals[0] if signals else None
        freed = next((t for t, mib in poller.samples
                      if first_signal and t >= first_signal and mib <= poller.idle), None)
        summary.update(
            poll_source=poller.source,
            poll_idle_mib=poller.idle,
            poll_samples=len(poller.samples),
            run_wall_s=round(host.get("duration_s", 0.0), 3),
            controller_start_to_first_signal_s=round(first_signal - t_run, 3)
            if first_signal else None,
            first_signal_to_idle_s=round(freed - first_signal, 3)
            if freed and first_signal else None,
            stages=host.get("stages"),
        )
        code, _, _ = fleetclean(out, "status_all.json", "status", "-i", str(inventory), "--json")
        subprocess.run([sys.executable, "-m", "fleetclean", "status", "-i", str(inventory)],
                       stdout=(out / "status_all.txt").open("w"), stderr=subprocess.STDOUT,
                       env=dict(os.environ, NO_COLOR="1", COLUMNS="120"), cwd=ROOT, check=False)
    finally:
        for pid in started:  # only what this script started, by PID
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.wait(timeout=30)
    summary["ok"] = all(checks.values())
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
