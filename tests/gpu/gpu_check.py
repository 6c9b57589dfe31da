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


class Run:
    """One check run: where its files go, its marker, and what it has found so far."""

    def __init__(self, out: Path, gpu: int) -> None:
        self.out = out
        self.gpu = gpu
        self.marker = f"fcgpu-{uuid.uuid4().hex[:12]}"
        self.checks: dict[str, bool] = {}
        self.summary: dict[str, Any] = {"marker": self.marker, "checks": self.checks}
        self.inventory = out / "inventory.yaml"
        self.inventory.write_text("all:\n  hosts:\n    gpuhost:\n      ansible_connection: local\n")
        self.started: list[int] = []
        self.limit = 0

    def snapshot(self, when: str, *, units: bool = False) -> None:
        """nvidia-smi's table, GPU query and compute apps as this moment's fixtures."""
        save_smi(self.out, f"plain_{when}.txt")
        save_smi(self.out, f"q_{when}.txt", f"--query-gpu={QUERY_GPU}",
                 "--format=csv,noheader,nounits")
        save_smi(self.out, f"apps_{when}.txt", f"--query-compute-apps={QUERY_APPS}",
                 "--format=csv,noheader,nounits")
        if units:
            save_smi(self.out, f"q_{when}_units.txt", f"--query-gpu={QUERY_GPU}",
                     "--format=csv,noheader")
            save_smi(self.out, f"apps_{when}_units.txt", f"--query-compute-apps={QUERY_APPS}",
                     "--format=csv,noheader")

    def fleetclean(self, name: str, *args: str) -> tuple[int, dict[str, Any] | None, float]:
        return fleetclean(self.out, name, *args, "-i", str(self.inventory), "--json",
                          "-e", f"max_used_mib={self.limit}")


# Starts argv in its own session and exits at once, printing its PID: the server's parent is
# then gone (it is reparented to init), as for a server started with nohup or by a launcher
# that has exited. No parent lives on to restart it, so the verification needs no settle.
DETACH = ("import subprocess, sys; p = subprocess.Popen(sys.argv[1:], start_new_session=True, "
          "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL); print(p.pid)")


def start_holder(run: Run, gib: float, child_gib: float, *, detached: bool = False,
                 main_exit: bool = False) -> tuple[subprocess.Popen[bytes], Path]:
    """The marked fake server (and its child), started in their own session (``detached``:
    by a launcher that exits at once); waits until both hold their memory."""
    tmp = run.out / "run"
    tmp.mkdir(exist_ok=True)
    ready, siglog = tmp / "ready", tmp / "signals"
    for stale in (ready, tmp / "ready.child", siglog):  # an OUTDIR used before
        stale.unlink(missing_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(run.gpu))
    argv = [sys.executable, str(HERE / "holder.py"), "sglang.launch_server", "--marker",
            run.marker, "--gib", str(gib), "--child-gib", str(child_gib), "--ready", str(ready),
            "--signal-log", str(siglog), *(["--main-exit"] if main_exit else [])]
    if detached:
        server = subprocess.Popen([sys.executable, "-c", DETACH, *argv], env=env,
                                  stdout=subprocess.PIPE)
        out, _ = server.communicate(timeout=60)
        pid = int(out.split()[0])
    else:
        server = subprocess.Popen(argv, env=env, start_new_session=True)
        pid = server.pid
    run.started.append(pid)
    deadline = time.monotonic() + 180
    while not ready.exists():
        if time.monotonic() > deadline or not _alive(pid):
            raise RuntimeError("holder did not become ready")
        time.sleep(0.1)
    if child_gib:
        run.started.append(int((tmp / "ready.child").read_text()))
    time.sleep(0.5)
    return server, siglog


def seed_hint(run: Run) -> None:
    """A status of the idle machine first: the host is noted clean (results/lastclean.py),
    so that the status with the server running reads the GPUs with --query-gpu and asks
    for the compute apps after it, as a host seen clean does when it is in use again."""
    code, status, _ = run.fleetclean("status_idle.json", "status")
    host = (status or {"hosts": [{}]})["hosts"][0]
    try:
        noted = json.loads((run.out / "state" / "last-clean.json").read_text())["hosts"]
    except (OSError, ValueError, KeyError):
        noted = {}
    run.checks["idle status clean, the host noted clean"] = (
        code == 0 and host.get("status") == "clean" and host.get("host") in noted)


def check_before(run: Run, gib: float) -> None:
    """While the memory is held: status reports it (dirty, never faulty) and --check
    signals nothing."""
    held = used_mib()
    run.summary["held_mib"] = held
    run.snapshot("held", units=True)
    run.checks["memory held while running"] = held[run.gpu] > run.limit + 1024 * gib * 0.9
    code, status, _ = run.fleetclean("status_held.json", "status")
    host = (status or {"hosts": [{}]})["hosts"][0]
    table_used = [g["memory_used_mib"] for g in host.get("gpus", [])]
    run.checks["status reports the held memory, dirty and not faulty"] = (
        code == 1 and host.get("status") == "dirty"
        and abs(table_used[run.gpu] - held[run.gpu]) <= 64
    )
    named = {p.get("pid") for g in host.get("gpus", []) for p in g.get("processes", [])}
    run.checks["status of the host seen clean names the server's processes"] = bool(
        named & set(run.started))
    code, check, _ = run.fleetclean("check.json", "run", str(PLAYBOOK), "-e",
                                    f"marker={run.marker}", "--check")
    alive = [p for p in run.started if _alive(p)]
    run.checks["--check changed nothing"] = alive == run.started and check is not None and (
        check["hosts"][0]["signalled"] == []
    )


def check_as_over_ssh(run: Run) -> None:
    """While the memory is held, the status script as sshd's login shell starts it
    (``transport.boot``: its GPU read in the command itself, the script read whole from
    standard input), the one path the local connection does not take (this machine has no
    sshd): for a host never seen (-q) and for one seen clean (--query-gpu, then the apps),
    the held memory and the server's processes, read through the real nvidia-smi."""
    sys.path.insert(0, str(ROOT))
    from fleetclean.results.parse import parse_script_output
    from fleetclean.transport.boot import command, first_read

    held = used_mib()[run.gpu]
    # The status of the held memory has just forgotten the host's hint: noted here again.
    (run.out / "state-seen").mkdir(exist_ok=True)
    (run.out / "state-seen" / "last-clean.json").write_text(
        json.dumps({"hosts": {"gpuhost": time.time()}}))
    for name, state, read in (("never seen", "state-none", " -q "),
                              ("seen clean", "state-seen", " --query-gpu=")):
        env = dict(os.environ, FLEETCLEAN_STATE_DIR=str(run.out / state))
        text = subprocess.run([sys.executable, "-m", "fleetclean", "show", "status", "-i",
                               str(run.inventory), "--host", "gpuhost"], capture_output=True,
                              text=True, env=env, cwd=ROOT, check=True).stdout
        first = first_read(text)
        done = subprocess.run(["sh", "-c", command(len(text.encode()), first)], input=text,
                              capture_output=True, text=True, timeout=120, check=False)
        (run.out / f"over_ssh_{state}.txt").write_text(done.stdout + done.stderr)
        report = parse_script_output(done.stdout, done.stderr, done.returncode)
        used = [g.memory_used_mib for g in report.gpus]
        named = {p.pid for p in report.processes}
        run.checks[f"status as sshd starts it, {name}: GPU read first, memory, server named"] = (
            read in first and len(used) > run.gpu and abs(used[run.gpu] - held) <= 64
            and bool(named & set(run.started)))


def teardown(run: Run, siglog: Path, poller: Poller) -> None:
    """The teardown, timed from the first signal to idle memory by ``poller`` (made, and
    its idle level read, before the holder started)."""
    poller.start()
    code, result, t_run = run.fleetclean("teardown.json", "run", str(PLAYBOOK),
                                         "-e", f"marker={run.marker}")
    time.sleep(0.3)
    poller.stop.set()
    poller.join()
    after = used_mib()
    run.summary["after_mib"] = after
    run.snapshot("after")
    host = (result or {"hosts": [{}]})["hosts"][0]
    checks = run.checks
    checks["teardown exit 0, host clean"] = code == 0 and host.get("status") == "clean"
    checks["every started process is gone"] = not any(_alive(p) for p in run.started)
    checks["real nvidia-smi back to idle"] = after[run.gpu] <= run.limit
    checks["fleetclean's table agrees with nvidia-smi"] = (
        [g["memory_used_mib"] for g in host.get("gpus", [])] == after)
    checks["signalled only what this script started"] = (
        {s["pid"] for s in host.get("signalled", [])} <= set(run.started))
    # Memory a killed process is still releasing is not a driver-level leak: the
    # verification ends by the clean rule, never by the leak (or stuck) one.
    checks["the killed process was never taken for a leak"] = (
        (host.get("verify") or {}).get("rule") == "clean"
        and "leak" not in json.dumps({k: v for k, v in host.items() if k != "stages"}).lower())
    checks["teardown never faulty"] = host.get("status") != "faulty"
    # A server whose main thread has ended (--main-exit) logs no signal: no handler runs.
    logged = siglog.read_text().splitlines() if siglog.exists() else []
    signals = sorted(float(line.split()[0]) for line in logged)
    first = signals[0] if signals else None
    freed = next((t for t, mib in poller.samples if first and t >= first and mib <= poller.idle),
                 None)
    run.summary.update(
        poll_source=poller.source, poll_idle_mib=poller.idle, poll_samples=len(poller.samples),
        run_wall_s=round(host.get("duration_s", 0.0), 3),
        controller_start_to_first_signal_s=round(first - t_run, 3) if first else None,
        first_signal_to_idle_s=round(freed - first, 3) if freed and first else None,
        stages=host.get("stages"),
    )


def check_after(run: Run) -> None:
    """The clean machine's status: clean, never faulty, and a table for the fixtures."""
    code, status, _ = fleetclean(run.out, "status_all.json", "status", "-i",
                                 str(run.inventory), "--json")
    host = (status or {"hosts": [{}]})["hosts"][0]
    run.checks["status afterwards clean, not faulty"] = code == 0 and host.get("status") == "clean"
    # Noted clean again: the next status reads with --query-gpu, and says the same.
    code, again, _ = fleetclean(run.out, "status_seen_clean.json", "status", "-i",
                                str(run.inventory), "--json")
    other = (again or {"hosts": [{}]})["hosts"][0]

    def rows(h: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(g.get("index"), g.get("uuid"), g.get("name"), g.get("memory_total_mib"))
                for g in h.get("gpus", [])]

    run.checks["status of the host seen clean: clean, the same rows"] = (
        code == 0 and other.get("status") == "clean" and rows(other) == rows(host)
        and bool(rows(host)))
    with (run.out / "status_all.txt").open("w") as fh:
        subprocess.run([sys.executable, "-m", "fleetclean", "status", "-i", str(run.inventory)],
                       stdout=fh, stderr=subprocess.STDOUT, check=False, cwd=ROOT,
                       env=dict(os.environ, NO_COLOR="1", COLUMNS="120"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gib", type=float, default=40.0)
    ap.add_argument("--child-gib", type=float, default=8.0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--detached", action="store_true",
                    help="the server's launcher exits at once (no parent lives on)")
    ap.add_argument("--main-exit", action="store_true",
                    help="the server's main thread calls pthread_exit once it holds its "
                    "memory, another thread holding it on (use with --child-gib 0)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.gpu)
    run.snapshot("idle")
    idle = used_mib()
    run.summary["idle_mib"] = idle
    # An idle H200 reads 0 MiB; allow what was already used before we started.
    run.limit = max(idle)
    server = None
    poller = Poller(args.gpu)  # its idle reading: before anything holds memory
    run.summary["detached"] = args.detached
    run.summary["main_exit"] = args.main_exit
    try:
        seed_hint(run)
        server, siglog = start_holder(run, args.gib, args.child_gib, detached=args.detached,
                                      main_exit=args.main_exit)
        check_before(run, args.gib)
        check_as_over_ssh(run)
        teardown(run, siglog, poller)
        check_after(run)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        for pid in run.started:  # only what this script started, by PID
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if server is not None:
            server.wait(timeout=30)
    run.summary["ok"] = all(run.checks.values())
    (run.out / "summary.json").write_text(json.dumps(run.summary, indent=2))
    print(json.dumps(run.summary, indent=2))
    return 0 if run.summary["ok"] else 1


def _alive(pid: int) -> bool:
    """Any of its threads not a zombie: a process whose main thread called pthread_exit
    lives on in another thread, its leader a zombie."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False


if __name__ == "__main__":
    sys.exit(main())
