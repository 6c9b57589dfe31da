"""The process table a stage scans (``lib-stage.sh``: ``fc_scan``): every process but the
kernel's threads. A real node runs a thousand or more of those; a simulated node, in its own
PID namespace, shows none, so these tests read /proc themselves (read-only) and, for the
kthreadd path, stand in a process of their own for PID 2 in a throw-away PID namespace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from nsrun import namespace_available

from fleetclean.engine.stages import template

PF_KTHREAD = 0x200000
LIBS = "\n".join(template(name) for name in ("lib.sh", "lib-match.sh", "lib-stage.sh"))
# The scan, then one "PID<TAB>command line" line for each process in the table.
SCAN = r"""
FC_WANT_IDENT=1 fc_scan
for p in "${FC_PIDS[@]}"; do printf '%s\t%s\n' "$p" "${FC_CMD[$p]}"; done
"""
# fc_read_stat logs each PID it reads to fd 3 and, for PIDs in $FAKE_KT, sets the kernel
# thread flag, as the kernel would for one of its threads.
FAKE = r"""
eval "$(declare -f fc_read_stat | sed '1s/fc_read_stat/fc_read_stat_real/')"
fc_read_stat() {
    echo "$1" >&3
    fc_read_stat_real "$1" || return 1
    [[ " $FAKE_KT " == *" $1 "* ]] && FC_F[6]=$((FC_F[6] | 0x200000))
    return 0
}
"""


def processes() -> dict[int, tuple[int, str, str]]:
    """PID -> (flags, starttime, command line) of every process /proc shows now."""
    seen = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(") ", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        seen[int(d.name)] = (int(fields[6]), fields[19], cmd.rstrip())
    return seen


def table(stdout: str) -> dict[int, str]:
    rows = (line.split("\t", 1) for line in stdout.splitlines() if "\t" in line)
    return {int(pid): cmd for pid, cmd in rows}


def test_the_scan_keeps_every_process_and_no_kernel_thread_of_this_machine() -> None:
    before = processes()
    out = subprocess.run(["bash", "-c", LIBS + SCAN], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    after = processes()
    scanned = table(out)
    # Alive through the whole scan, the same process (starttime) before and after.
    stable = {pid: v for pid, v in before.items() if after.get(pid, (0, "", ""))[1] == v[1]}
    kernel = {pid for pid, (flags, _, _) in stable.items() if flags & PF_KTHREAD}
    users = {pid: cmd for pid, (flags, _, cmd) in stable.items()
             if not flags & PF_KTHREAD and cmd and after[pid][2] == cmd}
    assert not kernel & set(scanned)
    assert {pid: scanned.get(pid) for pid in users} == users


needs_ns = pytest.mark.skipif(not namespace_available(), reason="needs root and unshare")

# In a new PID namespace the command's bash is PID 1; the first process it starts (before
# anything else forks) is PID 2,
# which starts two sleeps of its own; a third sleep is PID 1's.
TREE = r"""
bash -c 'sleep 60 & sleep 60 & wait' &
sleep 60 &
OTHER=$!
for i in {1..200}; do
    read -r -a KIDS </proc/2/task/2/children 2>/dev/null
    ((${#KIDS[@]} == 2)) && break
    read -r -t 0.02 <> <(:) || :
done
"""


def in_namespace(body: str) -> str:
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "bash", "-c",
         TREE + LIBS + FAKE + body], capture_output=True, text=True, check=True,
        timeout=60).stdout


@needs_ns
def test_kthreadds_children_are_left_out_unread() -> None:
    out = in_namespace('exec 3>/tmp/fc-scan-read.$$; FAKE_KT=2\n' + SCAN +
                       'echo "kids ${KIDS[*]} other $OTHER"\n'
                       'echo "read $(tr "\\n" " " </tmp/fc-scan-read.$$)"\n'
                       'rm -f /tmp/fc-scan-read.$$')
    scanned = table(out)
    words = dict(line.split(" ", 1) for line in out.splitlines() if line[:5] in ("kids ", "read "))
    kids = [int(pid) for pid in words["kids"].split(" other ")[0].split()]
    other = int(words["kids"].split(" other ")[1])
    read = {int(pid) for pid in words["read"].split()}
    assert len(kids) == 2
    assert not {2, *kids} & set(scanned)  # PID 2 and its children: not in the table
    assert not set(kids) & read  # ... and never read
    assert scanned[other] == "sleep 60"  # another process is
    assert scanned[1].startswith("bash -c")


@needs_ns
def test_a_kernel_thread_by_its_flags_is_left_out_and_its_command_line_never_read() -> None:
    out = in_namespace('exec 3>/dev/null; FAKE_KT=$OTHER\n' + SCAN +
                       'echo "other $OTHER cmd [${FC_CMD[$OTHER]}]"')
    scanned = table(out)
    other = next(line for line in out.splitlines() if line.startswith("other "))
    pid = int(other.split()[1])
    assert pid not in scanned
    assert other.endswith("cmd []")  # its table entry has no command line
    # PID 2 is no kernel thread here: it and its children are scanned as any process.
    assert scanned[2] == "bash -c sleep 60 & sleep 60 & wait"
    assert sum(cmd == "sleep 60" for cmd in scanned.values()) == 2
