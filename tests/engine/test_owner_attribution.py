"""Owner attribution (``owner.sh``) on captured ``/proc/PID/cgroup`` texts of real hosts
(``tests/data/cgroup/``), and on process trees with tmux, screen and slurmstepd ancestors.

No simulator: one bash runs the library over a fake /proc (``FC_PROC``) per case.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.stages import template
from fleetclean.models import Owner
from fleetclean.results.parse import parse_script_output

DATA = Path(__file__).resolve().parents[1] / "data" / "cgroup"


def _cases() -> list[tuple[str, str, Owner]]:
    cases = []
    for line in (DATA / "expected.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        case, pid1, kind, oid, name = line.split("\t")
        owner = Owner(kind, "" if oid == "-" else oid, "" if name == "-" else name)
        cases.append((case, pid1, owner))
    return cases


CASES = _cases()

# Runs fc_owner on PID 100 of each fake /proc given as an argument; prints one line each.
DRIVER = r"""
for proc in "$@"; do
    FC_PROC=$proc FC_CG_ROOTS_READ=0
    FC_PPID=([100]=1)
    fc_owner 100
    printf '%s\t%s\t%s\t%s\n' "${proc##*/}" "$FC_OWNER_KIND" "$FC_OWNER_ID" "$FC_OWNER_NAME"
done
"""


def fake_proc(root: Path, texts: dict[int, str]) -> str:
    """A fake /proc at ROOT, for FC_PROC: each PID's cgroup file its TEXT, PID 1's a
    systemd host's (pid1_v2) unless TEXTS has one."""
    for pid, text in {1: (DATA / "pid1_v2.cgroup").read_text(), **texts}.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cgroup").write_text(text)
    return str(root)


def run_owner(script: str, *args: str) -> list[list[str]]:
    done = subprocess.run(
        ["bash", "-c", template("lib.sh") + template("owner.sh") + script, "bash", *args],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def attributed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Owner]:
    root = tmp_path_factory.mktemp("proc")
    procs = []
    for case, pid1, _ in CASES:
        proc = root / f"{case}@{pid1}"
        for pid, name in (("1", pid1), ("100", case)):
            (proc / pid).mkdir(parents=True)
            (proc / pid / "cgroup").write_text((DATA / f"{name}.cgroup").read_text())
        procs.append(str(proc))
    rows = run_owner(DRIVER, *procs)
    return {row[0]: Owner(row[1], row[2], row[3]) for row in rows}


def test_every_captured_text_is_listed_in_expected() -> None:
    listed = {c for c, _, _ in CASES} | {p for _, p, _ in CASES}
    on_disk = {p.stem for p in DATA.glob("*.cgroup")}
    assert on_disk == listed


@pytest.mark.parametrize(("case", "pid1", "want"), CASES, ids=[f"{c}@{p}" for c, p, _ in CASES])
def test_owner_of_captured_cgroup(attributed: dict[str, Owner], case: str, pid1: str,
                                  want: Owner) -> None:
    assert attributed[f"{case}@{pid1}"] == want


def test_a_rootless_container_is_named_with_the_user_whose_daemon_runs_it(
    tmp_path: Path
) -> None:
    # Rootless Docker's systemd driver: the container's scope under the user's manager. Its
    # owner is docker (the record and JSON as for root's), and the daemon to stop it through
    # is that user's (FC_DOCKER_UID), not root's, which knows nothing of it; the daemon's
    # own unit and a root container name no user.
    texts = [(DATA / f"{name}.cgroup").read_text()
             for name in ("docker_rootless_systemd_v2", "dockerd_rootless_v2")]
    texts.append(f"0::/system.slice/docker-{'ab' * 32}.scope\n")
    proc = fake_proc(tmp_path, dict(enumerate(texts, start=100)))
    rows = run_owner(r"""
FC_PROC=$1 FC_PPID=([100]=1 [101]=1 [102]=1)
for pid in 100 101 102; do
    fc_owner "$pid"
    printf '%s\t%s\t%s\n' "$FC_OWNER_KIND" "$FC_OWNER_NAME" "${FC_DOCKER_UID[$FC_OWNER_ID]:-}"
done
""", proc)
    assert rows == [["docker", "5e0b8f6c2d4a", "1000"], ["systemd", "docker.service", ""],
                    ["docker", "ab" * 6, ""]]


# A process table, PID|PPID|COMM|ARGV0|CMD per process; PID 100 is the one attributed.
TREE = r"""
declare -A cg=([ssh]=/system.slice/ssh.service [session]=/user.slice/user-0.slice/session-1.scope
               [docker]=/system.slice/docker-CONTAINER.scope [slurmd]=/system.slice/slurmd.service)
FC_PROC=$1
mkdir -p "$FC_PROC/1" "$FC_PROC/100"
echo 0::/init.scope >"$FC_PROC/1/cgroup"
attribute() {  # NAME CGROUP ENV, then PID|PPID|COMM|ARGV0|CMD... from PID 100's parent up
    local name=$1 where=$2 env=$3 spec
    shift 3
    FC_PPID=() FC_COMM=() FC_ARGV0=() FC_CMD=() FC_CG_ROOTS_READ=0
    echo "0::${cg[$where]}" >"$FC_PROC/100/cgroup"
    printf '%s\0' "PATH=/usr/bin" $env >"$FC_PROC/100/environ"
    FC_PPID[100]=${1%%|*}
    for spec in "$@"; do
        IFS='|' read -r pid ppid comm argv0 cmd <<<"$spec"
        FC_PPID[$pid]=$ppid FC_COMM[$pid]=$comm FC_ARGV0[$pid]=$argv0 FC_CMD[$pid]=$cmd
    done
    fc_owner 100
    printf '%s\t%s\t%s\t%s\n' "$name" "$FC_OWNER_KIND" "$FC_OWNER_ID" "$FC_OWNER_NAME"
}
attribute tmux-in-ssh ssh TMUX=/tmp/tmux-0/default,31,2 \
    "31|1|tmux: server|/usr/bin/tmux|/usr/bin/tmux new -s train" "1|0|init|/sbin/init|/sbin/init"
attribute screen-in-session session STY=16.exp \
    "40|16|sh|/bin/sh|/bin/sh -c train.py" "16|1|screen|/usr/bin/SCREEN|/usr/bin/SCREEN -dmS exp"
attribute tmux-in-docker docker TMUX=/tmp/tmux-0/default,31,0 \
    "31|1|tmux: server|/usr/bin/tmux|/usr/bin/tmux" "1|0|init|/sbin/init|/sbin/init"
attribute job-under-slurmd slurmd "" "12|1|slurmstepd|slurmstepd: [4242.0]|slurmstepd: [4242.0]"
attribute hetjob-under-slurmd slurmd "" "12|1|slurmstepd|x|slurmstepd: [4242+1.batch]"
attribute stepd-inside-tmux ssh TMUX=/tmp/tmux-0/default,31,0 \
    "12|31|slurmstepd|x|slurmstepd: [7.0]" "31|1|tmux: server|/usr/bin/tmux|tmux"
attribute plain-session session "" "50|1|bash|-bash|-bash"
attribute tmux-no-environ session "" "31|1|tmux: server|tmux|tmux"
"""


def test_ancestors_name_tmux_screen_and_slurm_steps(tmp_path: Path) -> None:
    script = TREE.replace("CONTAINER", "ab" * 32)
    rows = {r[0]: Owner(r[1], r[2], r[3]) for r in run_owner(script, str(tmp_path))}
    assert rows == {
        # sessions without pam_systemd live in ssh.service: the tmux server says more
        "tmux-in-ssh": Owner("tmux", "31", "$2"),
        "screen-in-session": Owner("screen", "16", "16.exp"),
        # a container is what restarts it, whatever runs inside
        "tmux-in-docker": Owner("docker", "ab" * 32, "ab" * 6),
        "job-under-slurmd": Owner("slurm", "4242", "4242.0"),
        "hetjob-under-slurmd": Owner("slurm", "4242", "4242.batch"),
        "stepd-inside-tmux": Owner("slurm", "7", "7.0"),
        "plain-session": Owner("plain"),
        "tmux-no-environ": Owner("tmux", "31", ""),
    }


def test_owner_records_are_written_once_per_pid_and_parsed(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cgroup").write_text("0::/init.scope\n")
    units = {"41": "/system.slice/vllm.service", "42": "/user.slice/x/session-2.scope"}
    for pid, where in units.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cgroup").write_text(f"0::{where}\n")
    script = 'FC_PROC=$1; fc_rec begin 1 p h 0; fc_owner_records 41 42 41; fc_rec done 0\n'
    done = subprocess.run(["bash", "-c", template("lib.sh") + template("owner.sh") + script,
                           "bash", str(tmp_path)], capture_output=True, text=True, check=True)
    assert done.stdout.count("\towner\t") == 2
    report = parse_script_output(done.stdout, "", 0)
    assert report.owners == {41: Owner("systemd", "vllm.service", "vllm.service"),
                             42: Owner("plain")}


PODMAN_ID = "9c1d7e3b5a2f4e6081c3d5e7f9a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1e3f5a7"


def test_a_podman_container_is_named_with_its_rootless_user_wherever_its_conmon_runs(
    tmp_path: Path
) -> None:
    # 100: rootless Podman (its scope under alice's manager: her podman, not root's, knows
    # it); 101: root's; 102: a container whose conmon (103) is in a unit's cgroup: a
    # `podman generate systemd --new` unit's (--cgroups=no-conmon), or any unit's that ran
    # podman with INVOCATION_ID set (107, 108: podman-restart.service, which starts every
    # --restart=always container at boot): that cgroup names no owner, the container is
    # podman's (a unit that runs it is its PODMAN_SYSTEMD_UNIT label's: owner-act.sh);
    # 104: its worker, below the main process; 105: a container whose conmon is in its own
    # scope.
    texts = {
        # (another id: the user is the process's, never the container id's)
        100: (DATA / "podman_rootless_systemd_v2.cgroup").read_text().replace(
            PODMAN_ID, "ab" * 32),
        101: (DATA / "podman_systemd_v2.cgroup").read_text(),
        102: (DATA / "podman_systemd_v2.cgroup").read_text(),
        103: "0::/system.slice/vllm.service\n",
        104: (DATA / "podman_systemd_v2.cgroup").read_text(),
        105: (DATA / "podman_systemd_v2.cgroup").read_text(),
        106: (DATA / "conmon_systemd_v2.cgroup").read_text(),
        107: (DATA / "podman_systemd_v2.cgroup").read_text(),
        108: "0::/system.slice/podman-restart.service\n",
    }
    rows = run_owner(r"""
FC_PROC=$1
FC_PPID=([100]=1 [101]=1 [102]=103 [103]=1 [104]=102 [105]=106 [106]=1 [107]=108 [108]=1)
FC_COMM=([103]=conmon [106]=conmon [108]=conmon [102]=python3 [104]=python3 [105]=python3)
FC_CMD=([103]=/usr/bin/conmon [106]=/usr/bin/conmon [108]=/usr/bin/conmon [102]=x [104]=y
    [105]=z [107]=w [1]=init)
for pid in 100 101 102 104 105 107; do
    fc_owner_prep "$pid"
    printf '%s\t%s\t%s\n' "${FC_OK[$pid]}" "${FC_ON[$pid]}" "${FC_OU[$pid]}"
done
""", fake_proc(tmp_path, texts))
    assert rows == [["podman", "ab" * 6, "1000"]] + [["podman", PODMAN_ID[:12], ""]] * 5


def test_a_users_cgroup_named_after_a_container_never_makes_it_that_users(
    tmp_path: Path
) -> None:
    # Alice may make any cgroup under her manager (delegated to her): 300 in one named
    # after root's container's id, 302 in one below a "user@0.service" of hers. Neither
    # makes root's container (301) hers, nor hers root's: the user is each process's own
    # cgroup's, from user.slice/user-UID.slice/user@UID.service alone (303: no manager,
    # a unit of that name).
    # 302 is in a unit of alice's manager named user@0.service (as Quadlet's split
    # cgroups), never stopped (user@*: infrastructure).
    user = "0::/user.slice/user-1000.slice/user@1000.service/app.slice"
    texts = {
        300: f"{user}/libpod-{PODMAN_ID}.scope\n",
        301: (DATA / "podman_systemd_v2.cgroup").read_text(),
        302: f"{user}/user@0.service/libpod-{PODMAN_ID}.scope\n",
        303: "0::/user.slice/user-1000.slice/user@0.service/user.slice/"
             f"libpod-{PODMAN_ID}.scope\n",
    }
    rows = run_owner(r"""
FC_PROC=$1
FC_PPID=([300]=1 [301]=1 [302]=1 [303]=1)
for pid in 300 301 302 303; do
    fc_owner_prep "$pid"
    printf '%s\t%s\t%s\n' "${FC_OK[$pid]}" "${FC_OI[$pid]}" "${FC_OU[$pid]}"
done
""", fake_proc(tmp_path, texts))
    assert rows == [["podman", PODMAN_ID, "1000"], ["podman", PODMAN_ID, ""],
                    ["systemd", "user@1000.service/user@0.service", ""],
                    ["systemd", "user@0.service", ""]]
