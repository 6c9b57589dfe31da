"""Node faults the host sets by writing the node's files (see ``smi_state`` for the files).

``apply(node_dir, fault, args)`` raises SimError naming the usage for a bad fault or
argument. The SSH faults (``slow-banner``, ``slow-auth``, ``stall``, ``latency``) change the node's
listener and are handled by ``SimFleet.set_fault``; they are listed here so that one table
documents every fault.

>>> usage("leak")
'leak GPU MIB: MIB allocated on GPU with no process (freed by nvidia-smi -r -i GPU)'
"""

from __future__ import annotations

import json
from pathlib import Path

from fleetclean.errors import SimError
from fleetclean.sim import accounts, smi_state

# fault -> (argument names, what it does)
FAULTS: dict[str, tuple[str, str]] = {
    "none": ("", "healthy again: every nvidia-smi, kernel-log, sudo and sshd fault cleared"),
    "na": ("", "[N/A] in nvidia-smi's memory fields"),
    "nvml": ("", "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch, "
             "then the NVML library's version (exit 18)"),
    "missing": ("", "no nvidia-smi on the node (exit 127)"),
    "driver": ("", "nvidia-smi: couldn't communicate with the NVIDIA driver (exit 9)"),
    "nodevices": ("[STATUS]", "nvidia-smi: No devices were found, exit STATUS (default 6; "
                  "some versions exit 0)"),
    "nosupported": ("", "nvidia-smi: Failed to initialize NVML: No supported GPUs were found "
                    "(no GPU bound to the driver), exit 255"),
    "hang": ("[apps]", "every nvidia-smi call (with apps: each that lists processes) waits "
             "in the wedged driver and never answers (as after Xid 79 or 119): killed, it "
             "stays in state D until unstick, which fails it; none clears the fault"),
    "inforom": ("[GPU]", "nvidia-smi warns infoROM is corrupted on GPU (default 0), exit 14"),
    "lost": ("GPU", "GPU fell off the bus: its rows are errors, the others kept, exit 15"),
    "power": ("GPU", "GPU lacks external power: its rows are errors, exit 8"),
    "irq": ("GPU", "the kernel saw an interrupt issue with GPU: its rows are errors, exit 10"),
    "unknown": ("GPU", "GPU's handle fails (failed on the bus): its rows are Unknown Error, "
                "exit 255"),
    "badvalue": ("GPU reset|unknown|lost", "GPU's memory reads [GPU requires reset], "
                 "[Unknown Error] or [GPU is lost] instead of MiB, exit 0"),
    "fewer": ("[N]", "only the first N GPUs (default 7) are enumerated"),
    "retired-pending": ("GPU", "retired_pages.pending is Yes on GPU (and Xid 63 logged)"),
    "remapped-pending": ("GPU", "remapped_rows.pending is Yes on GPU (and Xid 63 logged)"),
    "xid": ("CODE [GPU]", "an NVRM Xid line for GPU (default 0) in the node's dmesg"),
    "leak": ("GPU MIB", "MIB allocated on GPU with no process (freed by nvidia-smi -r -i GPU)"),
    "reset-policy": ("strict|lenient", "whether nvidia-persistenced's handles block a reset"),
    "reset-delay": ("SECONDS", "nvidia-smi -r takes SECONDS before it answers, as real resets do"),
    "unstick": ("", "the node's driver answers at last: stuck processes (state D) go on"),
    "requiretty": ("", "sudo refuses every caller without a terminal (Defaults requiretty)"),
    "slow-banner": ("SECONDS", "sshd's banner comes SECONDS late"),
    "slow-auth": ("SECONDS", "banner on time, then authentication answers SECONDS late"),
    "stall": ("", "sshd sends its banner, then nothing"),
    "latency": ("SECONDS", "every SSH byte arrives SECONDS/2 late each way: a round trip of "
                "SECONDS, as across a VPN (the TCP handshake is not delayed)"),
}
SSH_FAULTS = ("slow-banner", "slow-auth", "stall", "latency")
IN_NODE_FAULTS = ("unstick",)  # done inside the node by SimFleet.set_fault
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_00000000",
    43: "Ch 00000008, intr 00000000. Reset channel verif error",
    45: "Ch 00000008, intr 00000000. Preemptive cleanup, due to previous errors",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping.",
    74: "NVLink: fatal error detected on link 4",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    120: "GSP task timeout @ pc:0x4bd36a4, task: 1",
}
# Xid 63 on a GPU that retires pages instead of remapping rows (before Ampere).
RETIRED_63 = "Dynamic Page Retirement: New retired page, reboot to activate, Address: 0x1f3c4"


def usage(fault: str) -> str:
    args, text = FAULTS[fault]
    return f"{fault} {args}: {text}" if args else f"{fault}: {text}"


def _ints(fault: str, args: list[str], need: int, most: int) -> list[int]:
    if not need <= len(args) <= most or not all(a.isdigit() for a in args):
        raise SimError(f"bad fault arguments {' '.join([fault, *args])!r}", hint=usage(fault))
    return [int(a) for a in args]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _edit_json(path: Path, key: str, value: object) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if value is None:
        data.pop(key, None)
    else:
        data[key] = value
    _write(path, json.dumps(data))


def xid_line(code: int, bus_id: str, text: str | None = None) -> str:
    """A kernel-log line as the NVIDIA driver writes it, stamped with this boot's clock.

    >>> xid_line(79, "00000000:18:00.0").split("] ", 1)[1]
    "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    """
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    text = text or XID_TEXT.get(code, "Unknown Error")
    where = f"NVRM: Xid (PCI:{bus_id[4:-2]}): {code}, pid='<unknown>', name=<unknown>"
    return f"[{uptime:12.6f}] {where}, {text}"


def clear(node_dir: Path) -> None:
    _write(node_dir / "fault", "none\n")
    if (node_dir / accounts.SUDOERS_D).is_dir():
        accounts.set_requiretty(node_dir, on=False)
    # kern.cleared too: a node reset by "none" has its whole boot log again.
    for name in ("lost", "power", "irq", "unknown", "pages.json", "badvalue.json", "gpu_count",
                 "kern.log", "kern.cleared", "reset_delay"):
        (node_dir / name).unlink(missing_ok=True)
    (node_dir / "kern.log").touch()


def apply(node_dir: Path, fault: str, args: list[str]) -> None:
    """Set one non-SSH fault on the node whose state dir is ``node_dir``."""
    if fault not in FAULTS or fault in SSH_FAULTS or fault in IN_NODE_FAULTS:
        raise SimError(f"unknown fault {fault!r}", hint=f"choose one of {', '.join(FAULTS)}")
    if fault in _WHOLE_TOOL:
        _ints(fault, args, 0, 0)
        _write(node_dir / "fault", f"{_WHOLE_TOOL[fault]}\n")
        return
    _SETTERS[fault](node_dir, fault, args)


# Faults of the whole tool: the word nvidia-smi reads from the node's "fault" file.
_WHOLE_TOOL = {"na": "na", "nvml": "nvml", "driver": "driver", "nosupported": "nosupported",
               "missing": "none"}  # missing: the binary goes (node.set_fault)


def _hang(node_dir: Path, fault: str, args: list[str]) -> None:
    """Every call, or (``apps``) those that list processes: a driver whose process
    enumeration is stuck while its memory counters still answer."""
    if args not in ([], ["apps"]):
        raise SimError(f"bad fault arguments {' '.join([fault, *args])!r}", hint=usage(fault))
    _write(node_dir / "fault", f"hang{':apps' if args else ''}\n")


def _none(node_dir: Path, fault: str, args: list[str]) -> None:
    _ints(fault, args, 0, 0)
    clear(node_dir)


def _inforom(node_dir: Path, fault: str, args: list[str]) -> None:
    _write(node_dir / "fault", f"inforom:{(_ints(fault, args, 0, 1) or [0])[0]}\n")


def _nodevices(node_dir: Path, fault: str, args: list[str]) -> None:
    """The exit status, where given: 6 as driver 580's -i of an unknown GPU; the bare
    "No devices were found" exits 0 on some versions, 6 on others (not captured here)."""
    statuses = _ints(fault, args, 0, 1)
    if statuses and statuses[0] > 255:
        raise SimError(f"bad fault arguments {' '.join([fault, *args])!r}", hint=usage(fault))
    _write(node_dir / "fault", f"nodevices:{(statuses or [6])[0]}\n")


def _lost(node_dir: Path, fault: str, args: list[str]) -> None:
    """lost, power, irq, unknown: one more GPU in the file of that name."""
    path = node_dir / fault
    old = path.read_text() if path.exists() else ""
    _write(path, f"{old.strip()} {_ints(fault, args, 1, 1)[0]}".strip() + "\n")


def _badvalue(node_dir: Path, fault: str, args: list[str]) -> None:
    """One GPU's memory read as an NVML error word (smi_state.BAD_VALUES); others kept."""
    if len(args) != 2 or not args[0].isdigit() or args[1] not in smi_state.BAD_VALUES:
        raise SimError(f"bad fault arguments {' '.join([fault, *args])!r}", hint=usage(fault))
    _edit_json(node_dir / "badvalue.json", str(int(args[0])), args[1])


def _fewer(node_dir: Path, fault: str, args: list[str]) -> None:
    _write(node_dir / "gpu_count", f"{(_ints(fault, args, 0, 1) or [7])[0]}\n")


def _pending(node_dir: Path, fault: str, args: list[str]) -> None:
    """A row marked for remapping (or a page for retirement), active at the next reset:
    on a real GPU, the ECC error that marks it is logged as Xid 63, as here."""
    gpu = _ints(fault, args, 1, 1)[0]
    key = fault.split("-", maxsplit=1)[0]
    pages = node_dir / "pages.json"
    old = json.loads(pages.read_text()).get(key, []) if pages.exists() else []
    _edit_json(pages, key, sorted({*old, gpu}))
    _log_xid(node_dir, 63, gpu, RETIRED_63 if key == "retired" else None)


def _xid(node_dir: Path, fault: str, args: list[str]) -> None:
    numbers = _ints(fault, args, 1, 2)
    _log_xid(node_dir, numbers[0], (numbers[1:] or [0])[0])


def _log_xid(node_dir: Path, code: int, gpu: int, text: str | None = None) -> None:
    gpus = json.loads((node_dir / "gpus.json").read_text())["gpus"]
    with (node_dir / "kern.log").open("a") as f:  # as the kernel keeps it: <level>[time] text
        f.write(f"<4>{xid_line(code, gpus[gpu]['bus_id'], text)}\n")


def _leak(node_dir: Path, fault: str, args: list[str]) -> None:
    gpu, mib = _ints(fault, args, 2, 2)
    _edit_json(node_dir / "leaks.json", str(gpu), mib or None)


def _reset_delay(node_dir: Path, fault: str, args: list[str]) -> None:
    try:
        seconds = float(args[0]) if len(args) == 1 else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 600:
        raise SimError(f"bad fault arguments {args!r}", hint=usage(fault))
    _write(node_dir / "reset_delay", f"{seconds}\n")


def _requiretty(node_dir: Path, fault: str, args: list[str]) -> None:
    _ints(fault, args, 0, 0)
    accounts.set_requiretty(node_dir, on=True)


def _reset_policy(node_dir: Path, fault: str, args: list[str]) -> None:
    if args not in (["strict"], ["lenient"]):
        raise SimError(f"bad fault arguments {args!r}", hint=usage(fault))
    _write(node_dir / "reset_policy", args[0] + "\n")


_SETTERS = {"none": _none, "inforom": _inforom, "lost": _lost, "power": _lost, "irq": _lost,
            "unknown": _lost, "nodevices": _nodevices, "badvalue": _badvalue, "fewer": _fewer,
            "retired-pending": _pending, "remapped-pending": _pending, "xid": _xid,
            "leak": _leak, "reset-delay": _reset_delay, "reset-policy": _reset_policy,
            "requiretty": _requiretty, "hang": _hang}
