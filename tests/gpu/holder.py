"""A CUDA process that looks like an SGLang server (or one of its workers) and holds GPU memory.

Used only by ``gpu_check.py`` on a machine with a real GPU. Every process it starts carries the
run's unique marker in its command line, so the teardown can be told to match nothing else.

    python3 holder.py sglang.launch_server --marker fcgpu-1a2b --gib 40 --child-gib 8 \
        --ready /tmp/x/ready --signal-log /tmp/x/signals
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("title")
    ap.add_argument("--marker", required=True)
    ap.add_argument("--gib", type=float, required=True)
    ap.add_argument("--child-gib", type=float, default=0.0)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--signal-log", required=True)
    ap.add_argument("--main-exit", action="store_true",
                    help="once ready, the main thread calls pthread_exit and a second one "
                    "holds the memory on (the leader a zombie, the process alive)")
    args = ap.parse_args()

    def on_term(signum: int, _frame: FrameType | None) -> None:
        # The moment the signal landed, for "first signal -> 0 MiB" (wall clock, same host).
        with open(args.signal_log, "a") as fh:
            fh.write(f"{time.time():.6f} {os.getpid()} {args.title} {signum}\n")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    import torch

    block = torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    if args.child_gib > 0:
        subprocess.Popen(
            [sys.executable, __file__, "sglang::scheduler_TP0", "--marker", args.marker,
             "--gib", str(args.child_gib), "--ready", args.ready + ".child",
             "--signal-log", args.signal_log],
        )
        deadline = time.monotonic() + 120
        while not os.path.exists(args.ready + ".child") and time.monotonic() < deadline:
            time.sleep(0.05)
    with open(args.ready, "w") as fh:
        fh.write(str(os.getpid()))
    if args.main_exit:
        # Python runs signal handlers in its main thread only: with it gone, SIGTERM must
        # be the kernel's default (the process ends), or nothing would ever end it but KILL.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        threading.Thread(target=hold, args=(block,)).start()
        ctypes.CDLL(None).pthread_exit(None)  # ctypes lets go of the GIL around the call
    hold(block)
    return 0


def hold(block: object) -> None:
    """Keep ``block`` (the GPU memory) referenced, asleep."""
    while block is not None:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
