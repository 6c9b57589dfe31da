"""Frozen values shared by every stage of the pipeline.

inventory -> Host; playbook -> Playbook/Stage; render -> str; transport -> RawOutput;
parse -> ScriptReport; fleet -> HostResult / RunResult; report -> text, JSON, CSV.
Nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetclean.errors import ExitStatus

Connection = Literal["ssh", "local"]


class Secret:
    """A password held for one run: its text comes out only through ``reveal()``, never in
    a repr, an f-string, a traceback's values or ``--json``.

    >>> s = Secret("hunter2")
    >>> (repr(s), f"{s}", s.reveal())
    ("Secret('***')", "Secret('***')", 'hunter2')
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class Host:
    """One selected host with its effective connection settings and playbook variables.

    ``address`` is ``ansible_host`` or else ``name``; ``vars`` holds every variable that is
    not an ``ansible_*`` connection variable, after group/host precedence.
    """

    name: str
    address: str
    port: int | None = None  # None: let ~/.ssh/config (or 22) decide
    user: str | None = None
    key: str | None = None
    connection: Connection = "ssh"
    become: bool = False
    become_user: str | None = None
    # sudo's password (ansible_become_password, or -K); None: sudo must not need one.
    become_password: Secret | None = None
    groups: tuple[str, ...] = ()
    vars: dict[str, Any] = field(default_factory=dict)
    proxy_jump: str | None = None
    # `-o Key=Value` options from ansible_ssh_common_args / ansible_ssh_extra_args,
    # keys lower-cased (userknownhostsfile, stricthostkeychecking, connecttimeout, ...).
    ssh_options: dict[str, str] = field(default_factory=dict)
    # The ssh config file these settings came from: jump hosts are looked up in it too;
    # with ssh's system-wide one after it where the run named none (no -F), as ssh reads.
    ssh_config: str | None = None
    ssh_config_system: bool = False
    # Every identity file in the order ssh tries them: the inventory's key, then -i and
    # -o IdentityFile of its ssh arguments, then the config's IdentityFile lines. ``key`` is
    # the first; () where there is at most that one.
    identities: tuple[str, ...] = ()


class HostStatus(str, enum.Enum):
    """The contract's host outcomes; values are what --json prints."""

    CLEAN = "clean"
    DIRTY = "dirty"
    # A GPU no kill can fix (lost, driver down, fewer GPUs than expected, Xid, pending row
    # remap): exit status 1 like dirty, but a person has to act on the hardware.
    FAULTY = "faulty"
    UNREACHABLE = "unreachable"
    AUTH_FAILED = "auth_failed"
    HOST_KEY_MISMATCH = "host_key_mismatch"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def failed(self) -> bool:
        """Not clean, dirty or faulty: the host could not be judged (exit status 2)."""
        return self not in (HostStatus.CLEAN, HostStatus.DIRTY, HostStatus.FAULTY)


OwnerKind = Literal["systemd", "docker", "podman", "kubernetes", "slurm", "tmux", "screen",
                    "plain"]
OWNER_KINDS: tuple[OwnerKind, ...] = ("systemd", "docker", "podman", "kubernetes", "slurm",
                                     "tmux", "screen", "plain")


@dataclass(frozen=True)
class Owner:
    """Who runs a process, as the node's cgroups and process tree tell it (``owner.sh``).

    ``id`` names it to its manager, ``name`` to a person: a unit (``vllm.service``; a user
    unit's id is ``user@1000.service/x.service``), a container (64 hex, short form 12), a
    pod (UID; name the container id), a job (``4242``; ``4242.0``), a tmux/screen session
    (server pid; session). ``plain``: none of those, both empty.
    """

    kind: OwnerKind
    id: str = ""
    name: str = ""


@dataclass(frozen=True)
class GpuRow:
    """One GPU as nvidia-smi reported it; ``None`` for a field it could not give ([N/A])."""

    index: int
    uuid: str
    name: str
    memory_used_mib: int | None
    memory_total_mib: int | None


@dataclass(frozen=True)
class GpuProcess:
    """One process holding a GPU: from --query-compute-apps or a device-file holder."""

    pid: int
    name: str  # the command line where the node could read it, else nvidia-smi's name
    used_memory_mib: int | None
    gpu_uuid: str
    user: str = ""
    protected: str = ""  # why fleetclean never signals it ("protected name"), or empty
    # True for a /dev/nvidiaN holder named only because no compute app explains the GPU.
    device_only: bool = False
    # In state D since fleetclean's SIGKILL: stuck in the kernel, no signal reaches it.
    stuck: bool = False
    owner: Owner | None = None  # None: the node could not say (not in its PID namespace)
    # Its start time (clock ticks after the node's boot), where the node read it: with the
    # PID, one process for its whole life (results/lastclean.py: named again next time).
    start: int | None = None


@dataclass(frozen=True)
class GpuReset:
    """What a ``gpu-reset`` stage did to one GPU: ``result`` is ok, failed, refused (a
    process took the GPU meanwhile) or would (--check)."""

    gpu: int
    result: str
    detail: str


@dataclass(frozen=True)
class ProcessRef:
    """A process a host's result names beside its GPUs: its PID and command line."""

    pid: int
    cmdline: str


@dataclass(frozen=True)
class Xid:
    """One NVIDIA driver Xid line of a host's kernel log: when (epoch seconds), the code,
    the PCI address it names, and the line itself."""

    epoch: int
    code: int
    pci: str
    text: str


@dataclass(frozen=True)
class Signalled:
    """One signal sent to one process by one stage."""

    pid: int
    cmdline: str
    # "TERM", "KILL", ...; "stop": stopped through its owner (systemctl stop, docker stop)
    signal: str
    stage: str = ""
    # What made it a target: the part of the command line its stage's pattern matched
    # (title, executable, module, script, code, cmdline), "tree" (in a match's tree) or
    # "gpu" (a gpu-holders stage); and its identity, what match: identity reads.
    match: str = ""
    identity: str = ""
    owner: Owner | None = None


@dataclass(frozen=True)
class Refusal:
    """A target left to its owner (a pod, a Slurm job): never signalled. ``who`` names the
    owner to a person (``pod ml/llm-0``, ``Slurm job 4242 (user alice)``), ``fix`` is what
    to do (``kubectl delete pod -n ml llm-0``, ``scancel 4242``)."""

    pid: int
    cmdline: str
    who: str
    fix: str
    owner: Owner | None = None


@dataclass(frozen=True)
class StageResult:
    """What one stage did on one host.

    status: "ok" (done, nothing left), "changed" (--check: would change), "failed"
    (could not do its job, e.g. processes remain or a backup is missing), "denied" (done,
    or with --check would be, but for processes this login may not signal: another user's,
    root's), "refused" (a
    guard stopped the teardown), "skipped" (not run because an earlier stage refused/failed).
    """

    name: str
    type: str
    status: str
    matched: int = 0
    signalled: int = 0
    remaining: int = 0
    duration_s: float = 0.0
    message: str = ""
    changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScriptReport:
    """Everything parsed from one host's script output."""

    stages: tuple[StageResult, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    signalled: tuple[Signalled, ...] = ()
    verified: bool | None = None  # None: the playbook has no verification or it never ran
    error: str | None = None  # a host-level error a person can act on (nvidia-smi, lock, ...)
    busy: bool = False
    verify_message: str = ""  # the verification's own words ("respawned after it was ...")
    # Which rule ended the verification: clean, leak, stuck, refused, respawn, deadline, error,
    # skipped.
    verify_rule: str | None = None
    faults: tuple[str, ...] = ()  # why a GPU is faulty (no kill fixes it), one line each
    leaks: tuple[tuple[int, int], ...] = ()  # (GPU index, MiB) that no process holds
    xids: tuple[Xid, ...] = ()  # every driver Xid line the kernel log held
    # Parents of killed GPU holders that live on (with their process-group ancestors).
    left_running: tuple[ProcessRef, ...] = ()
    stuck: tuple[ProcessRef, ...] = ()  # survived SIGKILL in state D (see GpuProcess)
    resets: tuple[GpuReset, ...] = ()  # what gpu-reset stages did, one per GPU
    # pid -> owner, for every process a stage matched or signalled (``owner`` records)
    owners: Mapping[int, Owner] = field(default_factory=dict)
    judged_gpus: tuple[int, ...] | None = None  # a scope's GPUs; None: every GPU
    refused: tuple[Refusal, ...] = ()  # targets left to their owner, one per PID
    warnings: tuple[str, ...] = ()  # e.g. an owner that may restart what was signalled
    ended: bool = False  # the script's output reached its end ("done")
    # Tokens of runs whose end the controller did not hear that the node has answered for
    # (told their journal, or has none to tell): results/unheard.py.
    answered: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmAction:
    """What ``--drain-dirty``/``--resume-clean`` did to a host's Slurm node: ``action`` is
    ``drain``, ``resume``, ``none`` or ``error``; states as ``sinfo`` spells them."""

    action: str
    state_before: str
    state_after: str
    reason: str = ""


@dataclass(frozen=True)
class HostResult:
    host: str
    status: HostStatus
    error: str | None = None
    duration_s: float = 0.0
    stages: tuple[StageResult, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    signalled: tuple[Signalled, ...] = ()
    slurm: SlurmAction | None = None  # only with --drain-dirty/--resume-clean
    verify_rule: str | None = None  # see ScriptReport.verify_rule
    xids: tuple[Xid, ...] = ()
    left_running: tuple[ProcessRef, ...] = ()  # see ScriptReport.left_running
    stuck: tuple[ProcessRef, ...] = ()  # see ScriptReport.stuck
    resets: tuple[GpuReset, ...] = ()  # see ScriptReport.resets
    # --gpus or an epilog's job: the only GPUs whose memory decided the status (the
    # others are shown, not judged); None: every GPU.
    judged_gpus: tuple[int, ...] | None = None
    refused: tuple[Refusal, ...] = ()  # see ScriptReport.refused
    warnings: tuple[str, ...] = ()  # see ScriptReport.warnings
    started: bool = False  # the script was started on the host (transport.ScriptOutput)
    ended: bool = False  # see ScriptReport.ended: heard to the end
    answered: tuple[str, ...] = ()  # see ScriptReport.answered
    # "address:port" as the inventory names the host, where the run dialled it ("" for a
    # result read back from JSON or a bundle's output): the problem lines fold hosts whose
    # messages differ only by it (results/table.py). Not in --json.
    where: str = ""
    # ``error`` with the PIDs of the processes it names as holders or left to their owner,
    # and of an nvidia-smi left waiting in a hung driver, written "<pid>", where it names
    # any: the problem lines fold hosts whose messages differ only by those, as a fleet's
    # servers have PIDs of their own on each host (a stage's own words keep theirs). Not in
    # --json.
    error_folded: str | None = None


@dataclass(frozen=True)
class RunResult:
    playbook: str
    duration_s: float
    hosts: tuple[HostResult, ...]
    interrupted: bool = False

    @property
    def exit_status(self) -> ExitStatus:
        if self.interrupted:
            return ExitStatus.INTERRUPTED
        if any(h.status.failed for h in self.hosts):
            return ExitStatus.FAILED
        if any(h.status in (HostStatus.DIRTY, HostStatus.FAULTY) for h in self.hosts):
            return ExitStatus.DIRTY
        return ExitStatus.OK
