"""What a stage's reads of the process table cost on this machine, this checkout against
another in the same run: the scan (``fc_scan`` with the identity a signal stage matches)
and the list of who holds a GPU's device file (``fc_open_fds /dev/nvidia``: one ``ls -l``
of every process's descriptors, which a ``scope: related`` stage with hits and the
gpu-holders stage run).

Read-only: both read /proc and signal nothing, so they run on the machine itself, with its
kernel threads (a simulated node, in its own PID namespace, shows none; a real 8-GPU node
has a thousand or more). ``--long N`` adds N processes of this script's own whose command
line is a long ``bash -c`` script, as launchers and containers run; ``--fds N`` adds four
that hold N descriptors between them, as an inference server's workers hold thousands (each
waits in bash itself; all are killed by PID at the end).

    .venv/bin/python benchmarks/scan.py --against /tmp/base [--rounds 7 --n 20 --long 4
                                                             --fds 20000]

Each round times ``--n`` calls of each by each checkout's packaged bash (alternating), and
prints milliseconds per call, what they found, and the median ratio of this checkout's time
to the other's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = Path("fleetclean/engine/stages")
TIMER = r"""
cd "$1" || exit 1
source ./lib.sh >/dev/null 2>&1
source ./lib-match.sh
source ./lib-stage.sh
FC_WANT_IDENT=1
if [[ $3 == scan ]]; then
    fc_scan
    t0=$EPOCHREALTIME
    for ((i = 0; i < $2; i++)); do fc_scan; done
    t1=$EPOCHREALTIME
    found=${#FC_PIDS[@]}
else
    t0=$EPOCHREALTIME
    for ((i = 0; i < $2; i++)); do fc_open_fds /dev/nvidia >/dev/null; done
    t1=$EPOCHREALTIME
    found=$(fc_open_fds /dev/null | wc -l)
fi
echo "$(( (${t1/./} - ${t0/./}) / $2 )) $found"
"""
# Holds descriptors $1 to $2 on /dev/null, then waits in bash itself.
FDS = r"""
for ((i = $1; i < $2; i++)); do eval "exec $i</dev/null"; done
read -r -t 600 _
"""
# A launcher's script: 40 commands, then a wait in bash itself (no child that would outlive
# it) on its standard input, a pipe this benchmark holds open until it kills it.
LONG = "; ".join(f"export FC_SCAN_BENCH_{i}=1 && test -n $HOME" for i in range(40)) + \
    "; read -r -t 600 _; true"


def kernel_threads() -> int:
    count = 0
    for d in Path("/proc").iterdir():
        try:
            flags = int((d / "stat").read_text().rsplit(") ", 1)[1].split()[6])
        except (OSError, ValueError, IndexError):
            continue
        count += bool(flags & 0x200000)
    return count


def timed(checkout: Path, n: int, what: str) -> tuple[float, int]:
    # EPOCHREALTIME's decimal point is the locale's: C's is the "." the timer cuts out.
    out = subprocess.run(["bash", "-c", TIMER, "timer", str(checkout / STAGES), str(n), what],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "LC_ALL": "C"}).stdout.split()
    return int(out[0]) / 1000, int(out[1])


def compare(args: argparse.Namespace, what: str, found: str) -> None:
    """Alternating rounds of ``what`` (scan, fds) by both checkouts, and the summary."""
    new: list[float] = []
    base: list[float] = []
    for r in range(args.rounds):
        ms_new, got_new = timed(ROOT, args.n, what)
        ms_base, got_base = timed(args.against, args.n, what)
        new.append(ms_new)
        base.append(ms_base)
        print(f"{what} round {r + 1}: this checkout {ms_new:7.2f} ms ({got_new} {found}), "
              f"{args.against.name} {ms_base:7.2f} ms ({got_base})", flush=True)
    ratios = [a / b for a, b in zip(new, base, strict=True)]
    print(f"{what}, median (min-max): this checkout {statistics.median(new):.2f} ms "
          f"({min(new):.2f}-{max(new):.2f}), {args.against.name} "
          f"{statistics.median(base):.2f} ms ({min(base):.2f}-{max(base):.2f}); "
          f"ratio this/baseline median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", type=Path, required=True, metavar="CHECKOUT",
                    help="the baseline checkout (its fleetclean/engine/stages)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=20, help="calls a round, per checkout")
    ap.add_argument("--long", type=int, default=0, metavar="N",
                    help="start N processes with a long `bash -c` command line first")
    ap.add_argument("--fds", type=int, default=0, metavar="N",
                    help="start 4 processes holding N descriptors between them first")
    args = ap.parse_args()
    if not (args.against / STAGES / "lib-stage.sh").is_file():
        ap.error(f"--against {args.against}: no {STAGES}/lib-stage.sh there")
    started = [subprocess.Popen(["bash", "-c", LONG], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(args.long)]
    each = args.fds // 4
    started += [subprocess.Popen(["bash", "-c", FDS, "fds", "10", str(10 + each)],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for _ in range(4 if each else 0)]
    try:
        if each:  # until every holder has its descriptors
            last = [Path(f"/proc/{p.pid}/fd/{9 + each}") for p in started[-4:]]
            deadline = time.monotonic() + 60
            while not all(f.exists() for f in last) and time.monotonic() < deadline:
                time.sleep(0.05)
        print(f"this machine: {sum(1 for d in Path('/proc').iterdir() if d.name.isdigit())} "
              f"processes, {kernel_threads()} of them kernel threads; {args.long} long "
              f"`bash -c` command lines ({len(LONG)} bytes) and {each * 4 if each else 0} "
              "descriptors of this benchmark's", flush=True)
        compare(args, "scan", "in the table")
        compare(args, "fds", "descriptors on /dev/null")
    finally:
        for proc in started:  # only what this script started, by PID
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
