"""The benchmarks' table: samples, rows with their targets, one command measured, and the
Markdown written into RESULTS.md."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 180


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
            ours = ms_cell(row.ours)
            met = "" if row.check is None else "yes" if row.check(0) else "no"
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
        if "CPU per host" in row.what and row.peer is not None:
            peer = f"{row.peer_name}: {ms_cell(row.peer)}"
        lines.append(f"| {row.section} | {row.what} | {ours} | {peer} | {ratio_s} "
                     f"| {row.target} | {met} |")
    return "\n".join(lines)


def ms_cell(sample: Sample) -> str:
    """A per-host CPU sample (seconds) as ``median ms (min-max)``."""
    w = sample.wall
    return f"{statistics.median(w) * 1000:.2f} ms ({min(w) * 1000:.2f}-{max(w) * 1000:.2f})"


def write_results(table: str) -> None:
    path = ROOT / "benchmarks" / "RESULTS.md"
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    text = path.read_text() if path.exists() else f"# Benchmark results\n\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}")
