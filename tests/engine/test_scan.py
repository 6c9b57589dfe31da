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
# The scan, then one "PID<TAB>command line<NUL>" record for each process in the table (a
# command line may hold newlines and tabs, and bytes that are no UTF-8).
SCAN = r"""
FC_WANT_IDENT=1 fc_scan
for p in "${FC_PIDS[@]}"; do printf '%s\t%s\0' "$p" "${FC_CMD[$p]}"; done
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


def processes() -> dict[int, tuple[int, str, bytes]]:
    """PID -> (flags, starttime, command line as fc_cmdline gives it) of every process /proc
    shows now."""
    seen = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_bytes().rsplit(b") ", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        seen[int(d.name)] = (int(fields[6]), fields[19].decode(), cmd.rstrip(b" \t\n\v\f\r"))
    return seen


def table(stdout: bytes) -> dict[int, bytes]:
    rows = (record.split(b"\t", 1) for record in stdout.split(b"\0") if b"\t" in record)
    return {int(pid): cmd for pid, cmd in rows}


def scan_this_machine() -> tuple[dict[int, bytes], dict[int, tuple[int, str, bytes]]]:
    """The scan's table, and the processes alive and unchanged (start time, command line)
    from before it to after it."""
    before = processes()
    out = subprocess.run(["bash", "-c", LIBS + SCAN], capture_output=True, check=True,
                         timeout=60).stdout
    after = processes()
    stable = {pid: v for pid, v in before.items()
              if after.get(pid, (0, "", b""))[1:] == v[1:]}
    return table(out), stable


def test_the_scan_keeps_every_process_of_this_machine_with_its_command_line() -> None:
    # A process may rewrite its title and back while the scan runs (sshd's listener counts
    # its startups: "0 of 512" -> "1 of 512" -> "0 of 512", another test's login), which
    # the snapshots before and after cannot see: a process read wrong three scans running
    # is the scan's fault.
    for _ in range(3):
        scanned, stable = scan_this_machine()
        users = {pid: cmd for pid, (flags, _, cmd) in stable.items()
                 if not flags & PF_KTHREAD and cmd}
        assert users  # this test's own process at least
        wrong = {pid for pid in users if scanned.get(pid) != users[pid]}
        if not wrong:
            return
    assert {pid: scanned.get(pid) for pid in wrong} == {pid: users[pid] for pid in wrong}


def test_the_scan_leaves_out_every_kernel_thread_of_this_machine() -> None:
    scanned, stable = scan_this_machine()
    kernel = {pid for pid, (flags, _, _) in stable.items() if flags & PF_KTHREAD}
    if not kernel:
        pytest.skip("no kernel thread visible here (a PID namespace of its own)")
    assert not kernel & set(scanned)


needs_ns = pytest.mark.skipif(
    not namespace_available() or not any(Path("/proc/self/task").glob("*/children")),
    reason="needs root, unshare and /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)")

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


def in_namespace(body: str) -> bytes:
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "bash", "-c",
         TREE + LIBS + FAKE + body], capture_output=True, check=True, timeout=60).stdout


def lines(out: bytes) -> list[str]:
    """The lines after the scan's records."""
    return out.rsplit(b"\0", 1)[-1].decode().splitlines()


@needs_ns
def test_kthreadds_children_are_left_out_unread(tmp_path: Path) -> None:
    log = tmp_path / "read"  # the PIDs fc_read_stat read
    out = in_namespace(f'exec 3>{log}; FAKE_KT=2\n' + SCAN +
                       'echo "kids ${KIDS[*]} other $OTHER"\n'
                       f'echo "read $(tr "\\n" " " <{log})"')
    scanned = table(out)
    words = dict(line.split(" ", 1) for line in lines(out) if line[:5] in ("kids ", "read "))
    kids = [int(pid) for pid in words["kids"].split(" other ")[0].split()]
    other = int(words["kids"].split(" other ")[1])
    read = {int(pid) for pid in words["read"].split()}
    assert len(kids) == 2
    assert not {2, *kids} & set(scanned)  # PID 2 and its children: not in the table
    assert not set(kids) & read  # ... and never read
    assert 2 in read and read - {2} - set(kids)  # PID 2's flags were read, and others
    assert scanned[other] == b"sleep 60"  # another process is in the table
    assert scanned[1].startswith(b"bash -c")


@needs_ns
def test_a_kernel_thread_by_its_flags_is_left_out_and_its_command_line_never_read() -> None:
    out = in_namespace('exec 3>/dev/null; FAKE_KT=$OTHER\n' + SCAN +
                       'echo "other $OTHER cmd [${FC_CMD[$OTHER]}]"')
    scanned = table(out)
    other = next(line for line in lines(out) if line.startswith("other "))
    pid = int(other.split()[1])
    assert pid not in scanned
    assert other.endswith("cmd []")  # its table entry has no command line
    # PID 2 is no kernel thread here: it and its children are scanned as any process.
    assert scanned[2] == b"bash -c sleep 60 & sleep 60 & wait"
    assert sum(cmd == b"sleep 60" for cmd in scanned.values()) == 2
