"""The limits a run works within (transport.limits). Open files: the soft limit raised as
far as the hard one allows, and what does not fit scaled down, in a child process whose
limits the test sets. Threads: a cgroup's pids.max, read from a tree laid out as Linux's
/proc and /sys are (cgroup v1, v2, a container's), with numbers small enough that this
process's own open-files limit is never raised for them; ``ulimit -u``, counted from such a
tree and, in a child run as a user of its own, against the kernel's own count."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclean.transport import limits

CHILD = r"""
import json, resource, sys
soft, hard = map(int, sys.argv[1:3])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
from pathlib import Path
from fleetclean.transport import limits
none = Path("/nonexistent")  # no /proc: this machine's own cgroups left out
fits = limits.fit_run(int(sys.argv[3]), int(sys.argv[4]), none)
out = {"forks": fits.forks.n, "kept": fits.kept.n}
out["soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
print(json.dumps(out))
"""


def limited(soft: int, hard: int, forks: int, hosts: int) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(soft), str(hard), str(forks),
                          str(hosts)],
                         capture_output=True, text=True, check=True, timeout=60)
    result: dict[str, int] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize(("limits", "asked", "want"), [
    # (soft, hard), (forks, hosts whose connections a watch keeps)
    # macOS's soft 256 under a higher hard limit: raised, nothing scaled down.
    ((256, 4096), (64, 1000), {"forks": 64, "kept": 1000, "soft": 64 + 256 + 1000}),
    # Linux's 1,024: a watch of 1,000 hosts needs more; the hard limit allows it.
    ((1024, 4096), (64, 1000), {"forks": 64, "kept": 1000, "soft": 1320}),
    # A hard limit that does not allow it: fewer hosts at once, and the connections kept
    # have what the hosts in flight leave (100 - 64 spare - 9 * 4, then 100 - 64 - 8 * 4).
    ((100, 100), (64, 1000), {"forks": 9, "kept": 0, "soft": 100}),
    ((100, 100), (8, 1000), {"forks": 8, "kept": 4, "soft": 100}),
    ((200, 200), (8, 1000), {"forks": 8, "kept": 104, "soft": 200}),
    # Room enough already: left as it is; a run that keeps nothing asks for nothing more.
    ((20000, 20000), (64, 256), {"forks": 64, "kept": 256, "soft": 20000}),
    ((256, 4096), (64, 0), {"forks": 64, "kept": 0, "soft": 64 + 256}),
])
def test_the_soft_limit_is_raised_as_far_as_needed_and_what_does_not_fit_is_scaled_down(
        limits: tuple[int, int], asked: tuple[int, int], want: dict[str, int]) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < limits[1]:
        pytest.skip(f"this machine's hard limit on open files is {hard}, under {limits[1]}")
    assert limited(*limits, *asked) == want


def cgroup_tree(tmp: Path, mountinfo: str, own: str, files: dict[str, str]) -> Path:
    """A root holding proc/self/{mountinfo,cgroup} and the cgroup ``files`` given."""
    (tmp / "proc/self").mkdir(parents=True)
    (tmp / "proc/self/mountinfo").write_text(mountinfo)
    (tmp / "proc/self/cgroup").write_text(own)
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


V2 = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
V1 = ("31 1 0:27 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
      "32 1 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")


def test_a_pids_limit_in_cgroup2_bounds_the_threads_and_is_named(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, V2, "0::/system.slice/job.service\n", {
        "sys/fs/cgroup/system.slice/job.service/pids.max": "424\n",
        "sys/fs/cgroup/system.slice/job.service/pids.current": "24\n",
        "sys/fs/cgroup/system.slice/pids.max": "max\n",
        "sys/fs/cgroup/system.slice/pids.current": "300\n"})
    assert limits.threads_left(root) == (
        400, "sys/fs/cgroup/system.slice/job.service/pids.max")
    # A watch of 500 hosts, 16 in flight: 400 - 16 - 16 * 3 connections kept.
    assert limits.fit_run(16, 500, root).kept == (
        336, "the cgroup's limit (sys/fs/cgroup/system.slice/job.service/pids.max)")
    assert limits.fit_forks(64, root) == (64, "")


def test_an_ancestors_tighter_limit_counts_in_cgroup_v1(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, V1, "5:memory:/x\n4:pids:/kubepods/pod1/c1\n0::/\n", {
        "sys/fs/cgroup/pids/kubepods/pod1/c1/pids.max": "max\n",
        "sys/fs/cgroup/pids/kubepods/pod1/c1/pids.current": "5\n",
        "sys/fs/cgroup/pids/kubepods/pod1/pids.max": "100\n",  # the pod's limit
        "sys/fs/cgroup/pids/kubepods/pod1/pids.current": "40\n"})
    assert limits.threads_left(root) == (60, "sys/fs/cgroup/pids/kubepods/pod1/pids.max")
    assert limits.fit_forks(64, root).n == (60 - 16) // 3
    pod = "the cgroup's limit (sys/fs/cgroup/pids/kubepods/pod1/pids.max)"
    assert limits.fit_run(8, 30, root) == ((8, ""), (60 - 16 - 8 * 3, pod))


def test_a_containers_own_cgroup_bound_without_a_namespace(tmp_path: Path) -> None:
    # Docker without a cgroup namespace: the mount shows the container's cgroup, and
    # /proc/self/cgroup names it by its path from the hierarchy's root.
    mounts = "40 1 0:27 /docker/ab12 /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids\n"
    root = cgroup_tree(tmp_path, mounts, "4:pids:/docker/ab12\n", {
        "sys/fs/cgroup/pids/pids.max": "200\n",
        "sys/fs/cgroup/pids/pids.current": "3\n"})
    # The container's own cgroup is the mount's top, and its limit is the container's.
    assert limits.threads_left(root) == (197, "sys/fs/cgroup/pids/pids.max")


def test_a_containers_own_cgroup_under_a_cgroup_namespace(tmp_path: Path) -> None:
    # Docker and Kubernetes on cgroup2 give a container its own cgroup namespace: it sees
    # its cgroup as "/", at the mount's top, where its pids.max is.
    root = cgroup_tree(tmp_path, V2, "0::/\n", {
        "sys/fs/cgroup/pids.max": "400\n",
        "sys/fs/cgroup/pids.current": "16\n"})
    assert limits.threads_left(root) == (384, "sys/fs/cgroup/pids.max")
    assert limits.fit_forks(200, root).n == (384 - 16) // 3


def test_a_cgroup_outside_the_namespace_is_not_read(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, V2, "0::/../sibling\n", {
        "sys/fs/cgroup/pids.max": "50\n",
        "sys/fs/cgroup/pids.current": "1\n"})
    assert limits.threads_left(root).n == sys.maxsize


def test_no_limit_no_cgroups_or_no_proc_leave_the_threads_unbounded(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path / "a", V2, "0::/user.slice\n", {
        "sys/fs/cgroup/user.slice/pids.max": "max\n",
        "sys/fs/cgroup/user.slice/pids.current": "12\n"})
    assert limits.threads_left(root) == (sys.maxsize, "")
    assert limits.threads_left(cgroup_tree(tmp_path / "b", V2, "0::/\n", {})).n == sys.maxsize
    assert limits.threads_left(tmp_path / "none").n == sys.maxsize


def test_a_full_cgroup_still_runs_one_host_at_a_time(tmp_path: Path) -> None:
    root = cgroup_tree(tmp_path, V2, "0::/c\n", {"sys/fs/cgroup/c/pids.max": "10\n",
                                                  "sys/fs/cgroup/c/pids.current": "10\n"})
    assert limits.fit_forks(64, root).n == 1
    assert limits.fit_run(64, 5, root).kept.n == 0


def proc_tree(tmp: Path, everyone: int, tasks: dict[int, tuple[int, int]]) -> Path:
    """A /proc with loadavg's count of every thread and ``{pid: (real uid, threads)}``."""
    (tmp / "proc").mkdir(parents=True)
    (tmp / "proc/loadavg").write_text(f"0.08 1.04 0.97 1/{everyone} 6876\n")
    for pid, (uid, threads) in tasks.items():
        (tmp / f"proc/{pid}").mkdir()
        (tmp / f"proc/{pid}/status").write_text(
            f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t{pid}\n"
            f"Uid:\t{uid}\t{uid + 1}\t{uid}\t{uid}\nGid:\t100\t100\t100\t100\n"
            f"Threads:\t{threads}\n")
    return tmp


def test_the_users_threads_are_counted_by_real_user_where_the_limit_is_tight(
    tmp_path: Path
) -> None:
    # 1000's threads: 40 + 2; 1001's (and 1000's effective-only) are not theirs. The
    # machine has 8 threads that /proc does not list (a container's view): maybe theirs.
    root = proc_tree(tmp_path, 300, {7: (1000, 40), 8: (1001, 200), 9: (1000, 2),
                                     10: (999, 50)})
    given = limits.Given(limit=256, uid=1000)
    assert limits.user_tasks_left(100, root, given) == (256 - 42 - 8, limits.USER_TASKS)
    # Enough room even if every thread of the machine were the user's: not walked.
    assert limits.user_tasks_left(100, root, limits.Given(100_000, 1000)).n == 100_000 - 300
    assert limits.user_tasks_left(10, tmp_path / "none", given).n == sys.maxsize


def test_a_process_name_that_is_not_utf8_is_still_counted(tmp_path: Path) -> None:
    root = proc_tree(tmp_path, 12, {7: (1000, 10), 8: (1000, 2)})
    (root / "proc/8/status").write_bytes(b"Name:\t\xff\xfe-x\nUid:\t1000\t1000\t1000\t1000\n"
                                         b"Threads:\t2\n")
    assert limits.user_tasks_left(100, root, limits.Given(40, 1000)).n == 28


NPROC_CHILD = r"""
import json, resource, threading
from fleetclean.transport import limits
fits = limits.fit_forks(64)
left = limits.user_tasks_left(1000)
soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
stop, started = threading.Event(), 0
try:
    while started < 1000:
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:  # can't start new thread: the kernel refused it
    pass
stop.set()
print(json.dumps({"left": left.n, "by": left.by, "forks": fits.n, "forks_by": fits.by,
                  "started": started, "soft": soft}))
"""


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # the process ended meanwhile
        return ""


def _world_runnable(path: Path) -> bool:
    """Whether any user may run ``path``: every folder above it searchable by all."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in path.parents) and bool(
        path.stat().st_mode & 0o005 == 0o005)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_NPROC counts threads on Linux")
def test_the_users_process_limit_is_counted_as_the_kernel_counts_it(tmp_path: Path) -> None:
    """A child as a user that runs nothing else, under ``ulimit -u`` 30 (hard 40): the soft
    limit is raised to 40, the room counted is exactly the threads the kernel then lets it
    start, and --forks 64 is cut to what fits, naming ``ulimit -u``."""
    import os
    import shutil
    import tempfile

    if os.getuid() != 0:
        pytest.skip("needs root, to run the child as a user of its own")
    python = next((Path(p) for p in ("/usr/bin/python3", sys.executable)
                   if Path(p).exists() and _world_runnable(Path(p))), None)
    if python is None:
        pytest.skip("no Python interpreter that another user may run")
    uid = 61000 + os.getpid() % 1000
    if any(f"\t{uid}\t" in _text(s) for s in Path("/proc").glob("[0-9]*/status")):
        pytest.skip(f"uid {uid} runs something on this machine")
    # The two modules the child needs, where that user may read them.
    code = Path(tempfile.mkdtemp(prefix="fleetclean-nproc-"))
    try:
        for package in ("fleetclean", "fleetclean/transport"):
            (code / package).mkdir()
            (code / package / "__init__.py").write_text("")
        src = Path(limits.__file__).parent.parent
        shutil.copy(src / "cgroupfs.py", code / "fleetclean/cgroupfs.py")
        shutil.copy(src / "transport/limits.py", code / "fleetclean/transport/limits.py")
        for p in [code, *code.rglob("*")]:
            p.chmod(0o755)
        out = subprocess.run(
            [str(python), "-c", NPROC_CHILD], check=False, capture_output=True, text=True,
            env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}, cwd=code, timeout=60,
            user=uid, group=uid, extra_groups=[],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NPROC, (30, 40)))
    finally:
        shutil.rmtree(code)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["soft"] == 40
    assert seen["started"] == 39  # the kernel's count: 40, less the child's own thread
    # Counted as the kernel counts, never more: a process that ends between the reads of
    # /proc/loadavg and of /proc may count as one the walk did not see (a few at most).
    assert seen["started"] - 4 <= seen["left"] <= seen["started"]
    assert seen["by"] == seen["forks_by"] == limits.USER_TASKS
    # fit_forks counts again, within the same few short of the kernel's count.
    fits = [(n - limits.THREAD_SPARE) // limits.THREADS_PER_HOST
            for n in (seen["started"] - 4, seen["started"])]
    assert fits[0] <= seen["forks"] <= fits[1]


def test_a_run_reads_the_limits_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI fits ``--forks`` itself (it warns when they are cut) and hands the fit on:
    the run takes it as it is, and fits only a bare count (the API's, the demo's)."""
    from fleetclean import fleet
    from fleetclean.transport import Options

    asked: list[int] = []

    def fit_forks(forks: int, root: Path = Path("/")) -> limits.Fit:
        asked.append(forks)
        return limits.Fit(forks)

    monkeypatch.setattr(limits, "fit_forks", fit_forks)
    fleet.run_fleet([], playbook="status", opts=Options(), forks=limits.Fit(3, "files"))
    assert asked == []
    fleet.run_fleet([], playbook="status", opts=Options(), forks=5)
    assert asked == [5]


def test_a_watch_reads_the_limits_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``status --watch`` fits its hosts in flight and its kept connections from one read
    of the threads' limits, and says each cut."""
    import argparse
    import io

    from fleetclean.commands import steps
    from fleetclean.commands.env import Env

    reads: list[int] = []

    def tasks_left(need: int, root: Path = Path("/")) -> limits.Fit:
        reads.append(need)
        return limits.Fit(limits.THREAD_SPARE + 4 * limits.THREADS_PER_HOST + 3, "the test")

    monkeypatch.setattr(limits, "tasks_left", tasks_left)
    err = io.StringIO()
    env = Env(stdout=io.StringIO(), stderr=err)
    forks, kept = steps.fitted_forks(argparse.Namespace(forks=64), env, 10, keep=True)
    assert reads == [limits.THREAD_SPARE + 10 * limits.THREADS_PER_HOST
                     + 10 * limits.THREADS_PER_KEPT]
    assert (forks.n, kept.n) == (5, 0)
    assert "running 5 at a time, not --forks 64" in err.getvalue()
    assert "status --watch keeps 0 of 10 hosts' connections" in err.getvalue()
