"""Run a rendered script with ``bash -s`` inside a throw-away PID + mount namespace.

Inside: a private tmpfs on /tmp, /run and /dev (with /dev/null etc. bound back, fake
/dev/nvidia0..7, /dev/nvidiactl, /dev/nvidia-uvm and the /dev/nvidia-caps directory), one on
/sys/module whose nvidia_uvm count is 0, and a fake ``nvidia-smi`` first on PATH. Nothing the
script does can reach the host's processes: it only sees what the test's ``setup`` started in
the namespace, and every process dies with the namespace.

    result = run_in_namespace(script, setup='spawn srv --hold /dev/nvidia0 sglang.launch_server')
    result.report.stages, result.alive("sglang")
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fleetclean.models import ScriptReport
from fleetclean.results.parse import parse_script_output

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workload.py"
FAKE_NVSMI = HERE / "fake_nvidia_smi.sh"

PRELUDE = r"""
set -e
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir /tmp/.hostdev
mount --rbind /dev /tmp/.hostdev
mount -t tmpfs tmpfs /dev
for n in null zero random urandom; do
    touch /dev/$n
    mount --bind /tmp/.hostdev/$n /dev/$n
done
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
mkdir /dev/shm /dev/nvidia-caps
touch /dev/nvidia{0..7} /dev/nvidiactl /dev/nvidia-uvm
# The nvidia_uvm count a status script picks its GPU read by (render.early_reads): 0, as
# on an idle node, not whatever this machine's driver counts (or that it has none).
mount -t tmpfs tmpfs /sys/module
mkdir /sys/module/nvidia_uvm
echo 0 >/sys/module/nvidia_uvm/refcnt
mkdir /tmp/fakebin
# The test files travel as text: the checkout itself may live under the /tmp just covered.
printf '%s' "$FC_FAKE_NVSMI_SRC" >/tmp/fakebin/nvidia-smi
chmod +x /tmp/fakebin/nvidia-smi
printf '%s' "$FC_WORKLOAD_SRC" >/tmp/workload.py
FC_WORKLOAD=/tmp/workload.py
export PATH=/tmp/fakebin:$PATH
set +e
# spawn NAME ARGS...: start a workload in the background, remember its ready file.
READY=()
spawn() {
    local n=$1
    shift
    "$FC_PY" "$FC_WORKLOAD" --ready "/tmp/ready.$n" "$@" </dev/null >/dev/null 2>&1 &
    READY+=("/tmp/ready.$n")
}
ready() {
    local f i
    for f in "${READY[@]}"; do
        for ((i = 0; i < 500; i++)); do [[ -e $f ]] && break; sleep 0.02; done
    done
}
"""

EPILOGUE = r"""
echo "__PS__"
for d in /proc/[0-9]*; do
    c=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)
    s=$(cut -d' ' -f3 "$d/stat" 2>/dev/null)
    [[ -n $c && $s != Z ]] && printf '%s\t%s\n' "${d#/proc/}" "$c"
done
"""


def namespace_available() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0 and shutil.which("unshare") is not None


@dataclass
class NsResult:
    stdout: str
    stderr: str
    returncode: int
    report: ScriptReport
    processes: dict[int, str]  # what still ran in the namespace after the script
    script_rc: int | None

    def alive(self, needle: str) -> list[str]:
        return [c for c in self.processes.values() if needle in c]


def run_in_namespace(script: str, *, setup: str = "", run: str = "bash -s", after: str = "",
                     timeout: float = 90) -> NsResult:
    """Start ``setup`` (bash; ``spawn NAME ARGS`` starts a workload), wait until every
    workload is ready, pipe ``script`` into ``run`` (default ``bash -s``), then run
    ``after`` and list the processes still alive."""
    program = "\n".join([
        PRELUDE, setup, "ready", f"{run}", 'echo "__RC__=$?"', after, EPILOGUE])
    # The real interpreter, not a venv's link that may sit under /tmp; workloads need only
    # the standard library.
    env = {**os.environ, "FC_PY": os.path.realpath(sys.executable),
           "FC_WORKLOAD_SRC": WORKLOAD.read_text(), "FC_FAKE_NVSMI_SRC": FAKE_NVSMI.read_text()}
    proc = subprocess.run(
        ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "bash", "-c", program],
        input=script, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    head, _, ps = proc.stdout.partition("__PS__\n")
    script_out, _, rc_text = head.rpartition("__RC__=")
    processes = {}
    for line in ps.splitlines():
        pid, _, cmd = line.partition("\t")
        if pid.isdigit():
            processes[int(pid)] = cmd.strip()
    rc_line = rc_text.split("\n", 1)[0].strip()
    script_rc = int(rc_line) if rc_line.isdigit() else None
    report = parse_script_output(script_out, proc.stderr, script_rc)
    return NsResult(proc.stdout, proc.stderr, proc.returncode, report, processes, script_rc)
