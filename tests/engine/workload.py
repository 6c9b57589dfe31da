"""A process the namespace tests start: holds GPU device files, reacts to SIGTERM as told.

    python3 workload.py --ready FILE [--hold /dev/nvidia0]... [--nvml] [--term exit|ignore|slow]
                        [--setsid] [--worker TAG]... [--orphan TAG] [--write PATH] TAG...

Trailing TAG words are what the process then shows, as the real ones do: several become
its command line (NUL-separated, as an exec'd ``python3 -m sglang.launch_server --tp 8``
reads), a single one its title (NUL-padded, comm set to it, as setproctitle does:
``sglang::scheduler_TP0``).
"""

import argparse
import ctypes
import os
import re
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--ready", required=True)
p.add_argument("--hold", action="append", default=[])
# A CUDA process opens /dev/nvidia-uvm beside its GPU's file; an NVML user (a monitoring
# agent, nvidia-persistenced) holds GPU files and no /dev/nvidia-uvm.
p.add_argument("--nvml", action="store_true")
p.add_argument("--term", default="exit")
p.add_argument("--setsid", action="store_true")
p.add_argument("--worker", action="append", default=[])
p.add_argument("--orphan")
p.add_argument("--write")
p.add_argument("tags", nargs="*")
a, extra = p.parse_known_args()


def show_as(tags):
    """Overwrite the argv area in place with the tags (it holds them: they are part of it)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    data = "\0".join(tags).encode()[: end - start - 1]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, data, len(data))
    if len(tags) == 1:
        with open("/proc/self/comm", "w") as f:
            f.write(tags[0][:15])


if a.tags:
    # The TAG words come last; argparse took "-m" and "--tp" of them as unknown options.
    show_as(sys.argv[len(sys.argv) - len(a.tags) - len(extra):])

if a.setsid:
    os.setsid()
held = [os.open(d, os.O_RDONLY) for d in a.hold]
if not a.nvml and any(re.fullmatch(r"/dev/nvidia[0-9]+", d) for d in a.hold):
    held.append(os.open("/dev/nvidia-uvm", os.O_RDONLY))
if a.write:
    writer = open(a.write, "w")  # noqa: SIM115 - held open on purpose
    writer.write("partial")
    writer.flush()

if a.term == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif a.term == "slow":
    def slow(*_):
        time.sleep(1.0)
        sys.exit(0)
    signal.signal(signal.SIGTERM, slow)

me = os.path.abspath(__file__)
readies = []
for i, tag in enumerate(a.worker):
    r = f"{a.ready}.w{i}"
    readies.append(r)
    subprocess.Popen([sys.executable, me, "--ready", r, "--term", a.term,
                      *[x for d in a.hold for x in ("--hold", d)], tag],
                     stdin=subprocess.DEVNULL)
if a.orphan:
    r = f"{a.ready}.orphan"
    readies.append(r)
    # Double fork: the grandchild is reparented to PID 1 but stays in our session.
    if os.fork() == 0:
        subprocess.Popen([sys.executable, me, "--ready", r, a.orphan],
                         stdin=subprocess.DEVNULL)
        os._exit(0)
    os.wait()
for r in readies:
    while not os.path.exists(r):
        time.sleep(0.01)
with open(a.ready, "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(3600)
