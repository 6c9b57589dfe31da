"""The verification (a playbook's ``verify:``): poll nvidia-smi until every GPU uses at
most ``max_used_mib`` or ``timeout`` passes, then report GPUs, compute apps and holders.

Not a stage type a playbook lists under ``stages:``, but declared the same way: options,
shell assignments, template, and the records only it writes (``nvsmi``, ``gpu``, ``app``,
``holder``, ``verify``).

``leak_quiet``: a GPU above ``max_used_mib`` that no unprotected process holds and whose
memory has not fallen for this long (the window restarts at every decrease) is a
driver-level leak; once every GPU above the threshold is one, the verification ends there
(rule ``leak``) instead of waiting for ``timeout`` (rule ``deadline``).

``settle``: when a killed GPU holder's parent lives on, a clean read counts only once this
long has passed since the last signal; a holder that its supervisor respawns (systemd's
default RestartSec is 100 ms, plus the start-up of the process) shows up there as dirty.

>>> from fleetclean.engine.stages.base import Readings
>>> r = Readings()
>>> VERIFY.records["verify"](r, ["dirty", "0", "30000", "1 GPU(s) above 0 MiB"])
>>> r.verify, r.verify_message, r.verify_rule
('dirty', '1 GPU(s) above 0 MiB', None)
>>> VERIFY.records["verify"](r, ["dirty", "0", "900", "memory held by no process", "leak"])
>>> r.verify_rule
'leak'
"""

from __future__ import annotations

from fleetclean.engine.checks import integer, number, positive_number
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import (
    SMI_HUNG,
    SMI_HUNG_WORDS,
    Option,
    Readings,
    StageType,
    packaged,
    seconds_ms,
)

# The one read of the GPUs (fc_verify_read_q in verify.sh: FC_VQ_SECTIONS; a test holds
# the two together): the row remapper's section only where the kernel log cannot rule out a
# pending remap (fc_verify_gate). A status script starts the first, without it, early
# (render.early_reads), and the remapper's beside it where needed.
VERIFY_Q_SECTIONS = ("MEMORY,PIDS", "MEMORY,PIDS,ROW_REMAPPER")
VERIFY_Q_ARGS = f"-q -d {VERIFY_Q_SECTIONS[0]}"
# The early read of a node whose kernel counts no CUDA process (render.early_reads,
# verify.sh: fc_verify_read_gpus): the rows, as pdsh users ask for them.
VERIFY_GPU_ARGS = ("--query-gpu=index,uuid,name,memory.used,memory.total "
                   "--format=csv,noheader,nounits")
# An Xid of an ECC event (bash ERE), after which a remap or a retirement may be pending
# (verify.sh: FC_VECC_RE).
ECC_XID_RE = r"NVRM: Xid \([^)]*\): (48|63|64|92|94|95|140|154),"
# What of the kernel log reaches bash (a sed script; verify.sh: FC_VKLOG_SED): its first
# line, which says whether the log is whole since boot, and the driver's Xid lines. bash's
# read and matches took 11.7 ms of CPU for a 160 KB boot log on the H200's host, which sed
# passes over in C (benchmarks/RESULTS.md).
KERNEL_LOG_SED = "1{p;d;};/NVRM: Xid/p"
# The kernel log's levels read where the kernel's default message level is one of them
# (verify.sh: FC_VKLOG_LEVELS): the driver prints an Xid at that default level (it gives
# printk no level of its own) or at err, and the kernel's banner, the log's first line, at
# notice. dmesg then formats only these: 1.3 ms of CPU for the simulated 160 KB boot log,
# against 5.5 ms for all of it and 1.5 ms more for the sed that passes the rest over.
KERNEL_LOG_LEVELS = "emerg,alert,crit,err,warn,notice"


def _assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    return [
        f"opt_max_used_mib={o['max_used_mib']}",
        f"opt_timeout_ms={seconds_ms(o['timeout'])}",
        f"opt_interval_s={o['interval']:g}",
        f"opt_interval_ms={seconds_ms(o['interval'])}",
        f"opt_settle_ms={seconds_ms(o['settle'])}",
        f"opt_leak_quiet_ms={seconds_ms(o['leak_quiet'])}",
    ]


def _nvsmi(r: Readings, a: list[str]) -> None:
    text = a[1].strip() or "(no output)"
    # Exit 0 with no GPU listed ("No devices were found" on some versions) did not fail.
    # 127: not found; 124: it did not answer (lib.sh: fc_smi_hung), the text the node's.
    hung = a[0] == str(SMI_HUNG) and text.startswith(SMI_HUNG_WORDS)
    r.nvsmi = (text if a[0] == "127" or hung else
               f"nvidia-smi listed no GPU: {text}" if a[0] == "0"
               else f"nvidia-smi failed (exit {a[0]}): {text}")
    r.nvsmi_exit = int(a[0])


def _gpu(r: Readings, a: list[str]) -> None:
    r.gpu_lines.append(a[0])


def _app(r: Readings, a: list[str]) -> None:
    r.app_lines.append(a[0])


def _holder(r: Readings, a: list[str]) -> None:
    # The GPU's index, from scripts that name it (its /dev/nvidiaN is its device minor,
    # which need not be its index); before, the N of the device file was the index.
    index = a[4] if len(a) > 4 and a[4] else a[1].removeprefix("/dev/nvidia")
    r.holders.append((int(a[0]), a[1], a[2], int(index) if index.isdigit() else None))
    if len(a) > 3 and a[3]:
        r.protected[int(a[0])] = a[3]


def _proc(r: Readings, a: list[str]) -> None:
    r.procs[int(a[0])] = (a[1], a[2], a[3], a[4] if len(a) > 4 else "")
    if len(a) > 5 and a[5].isdigit():
        r.starts[int(a[0])] = int(a[5])


def _bare(r: Readings, a: list[str]) -> None:
    r.bare[int(a[0])] = int(a[1])


def _pages(r: Readings, a: list[str]) -> None:
    r.pages[int(a[0])] = (a[1], a[2])


def _boot(r: Readings, a: list[str]) -> None:
    r.boot_epoch = int(a[0])


def _xid(r: Readings, a: list[str]) -> None:
    r.xids.append((int(a[0]), a[1]))


def _verify(r: Readings, a: list[str]) -> None:
    r.verify, r.verify_message = a[0], a[3]
    # Scripts from before the rule field: none.
    r.verify_rule = a[4] if len(a) > 4 else None
    r.current = None


VERIFY = StageType(
    name="verify",
    options=(
        Option("max_used_mib", integer, 0),
        Option("timeout", number, 30),
        Option("interval", positive_number, 0.2),
        Option("settle", number, 1.0),
        Option("leak_quiet", number, 1.0),
    ),
    assignments=_assignments,
    template=packaged("verify.sh"),
    records={"nvsmi": _nvsmi, "gpu": _gpu, "app": _app, "holder": _holder, "verify": _verify,
             "proc": _proc, "bare": _bare, "pages": _pages, "boot": _boot, "xid": _xid},
    aliases={"verify_timeout": "timeout", "poll_interval": "interval"},
    libraries=("owner.sh",),
)
