"""Faulty is not dirty: what no kill can fix, from what a host's script reported.

A host is ``faulty`` (exit status 1, like ``dirty``, but a person must act on the hardware
or the driver) when one of these holds; ``error`` when nvidia-smi failed in a way that
proves nothing about a GPU (the tool is missing, or refused the query).

=====================================  ========  ========================================
nvidia-smi says                        status    why
=====================================  ========  ========================================
exit 6, "No devices were found"        faulty    the driver sees no GPU on a GPU node
exit 8, power cables not attached      faulty    hardware
exit 9, driver not loaded / no comms   faulty    the driver is down: no GPU can be used
exit 10, interrupt issue with a GPU    faulty    hardware
exit 14, InfoROM corrupted             faulty    hardware (its rows are kept)
exit 15, GPU fell off the bus / lost   faulty    hardware (the other GPUs' rows are kept)
"Unable to determine the device       faulty    a GPU does not answer (its exit status
handle for GPU...", any exit status              varies: 15 lost, 255 Unknown Error)
"No devices were found", any status    faulty    some versions exit 0
"No supported GPUs were found"         faulty    no GPU is bound to the driver
no answer within ``smi_timeout``,      faulty    the driver is hung (after an Xid 79 or
outliving SIGKILL (state D)                      119, say); one SIGKILL ended: error
exit 18, Driver/library version        faulty    the driver was upgraded and not reloaded:
mismatch                                         no CUDA job can run until a reboot
exit 18, other NVML failures           error     permissions, a missing library
exit 2, 3, 4, 12, 13, 255              error     bad query, no permission, no library
missing binary (127)                   error     nothing proves a GPU fault
``[N/A]`` in memory.used               error     no number: the state is unknown
``[GPU requires reset]``,              faulty    NVML's words for a GPU in that state
``[GPU is lost]``, ``[Unknown Error]``
in memory.used
``[N/A]`` in the pending-page fields   (none)    the driver does not track them
retired_pages / remapped_rows pending  faulty    a reset or reboot must apply them
fewer GPUs than ``expected_gpus``      faulty    a GPU is gone from the bus
a hardware Xid since the last run      faulty    see :data:`HARDWARE_XIDS`
=====================================  ========  ========================================

>>> nvsmi_fault(15, "Unable to determine the device handle for GPU0000:AB:00.0: GPU is lost.")
...     # doctest: +ELLIPSIS
'nvidia-smi exit 15 (GPU fell off the bus or is lost): Unable to determine ...: GPU is lost.'
>>> nvsmi_fault(18, "Failed to initialize NVML: Insufficient Permissions") is None
True
>>> nvsmi_fault(4, "Unable to determine the device handle for GPU0000:1B:00.0: "
...             "Insufficient Permissions") is None
True
>>> nvsmi_fault(255, "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error")
...     # doctest: +ELLIPSIS
'nvidia-smi exit 255 (a GPU does not answer: fallen off the bus or failed): Unable ...'
>>> value_faults(" GPU0=[N/A] GPU3=[GPUrequiresreset]")
["GPU3: memory.used reads '[GPU requires reset]': reset the GPU (nvidia-smi -r -i 3) or reboot"]
>>> x = parse_xid(1000, 42, "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', GPU has fallen")
>>> x.epoch, x.code, x.pci
(1042, 79, '0000:18:00')
>>> is_hardware_xid(79), is_hardware_xid(13)
(True, False)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from fleetclean.engine.stages.base import SMI_HUNG, SMI_HUNG_WORDS
from fleetclean.models import HostResult, HostStatus, Xid

NVSMI_FAULTY: dict[int, str] = {
    6: "no GPU found",
    8: "external power cables not attached",
    9: "NVIDIA driver not loaded",
    10: "kernel detected an interrupt issue with a GPU",
    14: "InfoROM corrupted",
    15: "GPU fell off the bus or is lost",
}
"""nvidia-smi's documented exit statuses that mean a GPU or its driver is faulty."""

HARDWARE_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""Xids that name the hardware or the driver: double-bit ECC (48), row remapping (63,
64), NVLink (74), fallen off the bus (79), high single-bit ECC rate (92), contained and
uncontained ECC (94, 95), GSP timeouts (119, 120). Application Xids (13 graphics engine
exception, 31 MMU fault, 43 stopped channel, 45 preemptive cleanup) are what a killed CUDA
process logs: never a fault."""

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")


NVSMI_FAULTY_WORDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # NVML's reason follows the handle's failure: only these name a broken GPU (not, say,
    # Insufficient Permissions).
    ("device handle for GPU", "a GPU does not answer: fallen off the bus or failed",
     ("Unknown Error", "GPU is lost", "requires reset", "fallen off the bus")),
    ("No devices were found", "no GPU found", ()),
    ("No supported GPUs were found", "no GPU bound to the NVIDIA driver", ()),
    ("Driver/library version mismatch", "the NVIDIA driver and its library differ: the driver "
     "was upgraded and not reloaded; reboot the node", ()),
)
"""nvidia-smi's words that prove a GPU or driver fault whatever its exit status, which
varies by version and by NVML error (a GPU whose handle fails with "Unknown Error" exits
255, "No devices were found" exits 6 or 0)."""

# NVML's words in place of a number, and what a person does next.
_VALUE_WORDS = {"[GPU requires reset]": "reset the GPU (nvidia-smi -r -i {i}) or reboot",
                "[Unknown Error]": "reset the GPU (nvidia-smi -r -i {i}) or reboot",
                "[GPU is lost]": "reboot the node"}
_FAILED = re.compile(r"^nvidia-smi (failed \(exit \d+\)|listed no GPU): ")
_SPACELESS = {words.replace(" ", ""): words for words in _VALUE_WORDS}
_NONUM = re.compile(r"GPU(\d+)=(\[[^\]]*\])")


def nvsmi_fault(code: int, text: str) -> str | None:
    """The fault an nvidia-smi exit status or its words prove, or None (an ``error``, or
    success). One that did not answer at all (``SMI_HUNG``) and outlived SIGKILL, waiting
    in the driver (state D), is the driver's fault, in the node's words."""
    if code == SMI_HUNG and text.startswith(SMI_HUNG_WORDS):
        # Killed, it was only slow (an overloaded node, say): an error, not a fault.
        return text if "(state D)" in text else None
    what = NVSMI_FAULTY.get(code) or next(
        (why for words, why, reasons in NVSMI_FAULTY_WORDS
         if words in text and (not reasons or any(r in text for r in reasons))), None)
    if what is None:
        return None
    said = _FAILED.sub("", text.strip())  # the node's "nvidia-smi failed (exit N): " once
    return f"nvidia-smi exit {code} ({what}): {said}"


# The PIDs the node's sentence of an nvidia-smi that did not answer names ("PID 1721",
# "(PID 1721, 1722)": lib.sh, fc_smi_hung and fc_smi_noted), each host's own.
_SMI_PIDS = re.compile(r"(?<=PID )[0-9]+(?:, [0-9]+)*")


def smi_pids_folded(text: str, placeholder: str) -> str:
    """``text`` with the PIDs of its sentences of an nvidia-smi that did not answer written
    ``placeholder`` (what the problem lines fold hosts by: a fleet whose driver hung on
    many nodes); any other text as it is.

    >>> smi_pids_folded("nvidia-smi not started: PID 1721, 1722, left by an earlier run", "<pid>")
    'nvidia-smi not started: PID <pid>, left by an earlier run'
    """
    if not any(words in text for words in SMI_HUNG_WORDS):
        return text
    return _SMI_PIDS.sub(placeholder, text)


def value_faults(nonum: str) -> list[str]:
    """The GPUs whose memory.used is NVML's word for a broken GPU, from the verification's
    list of values that are no number (`` GPU0=[N/A] GPU3=[GPU requires reset]``); [N/A]
    alone proves nothing."""
    out = []
    for index, value in _NONUM.findall(nonum):
        # The node's script drops the spaces of a value ("[GPUrequiresreset]").
        words = _SPACELESS.get(value.replace(" ", ""))
        if words is not None:
            todo = _VALUE_WORDS[words].format(i=index)
            out.append(f"GPU{index}: memory.used reads '{words}': {todo}")
    return out


def is_hardware_xid(code: int) -> bool:
    return code in HARDWARE_XIDS


def parse_xid(boot_epoch: int, since_boot: int, line: str) -> Xid | None:
    """One kernel-log line (its timestamp already split off) as an Xid, or None."""
    m = _XID.search(line)
    if m is None:
        return None
    return Xid(epoch=boot_epoch + since_boot, code=int(m.group(2)), pci=m.group(1), text=line)


def pages_faults(pages: Mapping[int, tuple[str, str]]) -> list[str]:
    """``{index: (retired_pending, remapped_pending)}`` -> one fault line per GPU.

    >>> pages_faults({1: ("No", "Yes")})
    ['GPU1: remapped rows pending: reset the GPU (nvidia-smi -r -i 1) or reboot']
    """
    out = []
    for index, (retired, remapped) in sorted(pages.items()):
        what = [w for w, v in (("retired pages", retired), ("remapped rows", remapped))
                if v.strip() == "Yes"]
        if what:
            out.append(f"GPU{index}: {' and '.join(what)} pending: reset the GPU "
                       f"(nvidia-smi -r -i {index}) or reboot")
    return out


def history_faults(host: HostResult, *, expected_gpus: int | None,
                   since_epoch: float | None) -> list[str]:
    """Faults that need the host's past: fewer GPUs than expected, hardware Xids logged
    since its last run (``since_epoch``; None: since boot).

    >>> from fleetclean.models import GpuRow
    >>> h = HostResult("gpu01", HostStatus.CLEAN, gpus=(GpuRow(0, "u", "H200", 0, 1),),
    ...                xids=(Xid(900, 79, "0000:18:00", "..."), Xid(990, 13, "0000:18:00", "...")))
    >>> history_faults(h, expected_gpus=8, since_epoch=950)
    ['1 GPU(s) visible, 8 expected (expected_gpus): a GPU is missing from the bus']
    >>> history_faults(h, expected_gpus=None, since_epoch=None)
    ['Xid 79 on PCI 0000:18:00 (hardware/driver error in the kernel log)']
    """
    out = []
    if expected_gpus is not None and host.gpus and len(host.gpus) < expected_gpus:
        out.append(f"{len(host.gpus)} GPU(s) visible, {expected_gpus} expected "
                   "(expected_gpus): a GPU is missing from the bus")
    seen: dict[tuple[int, str], None] = {}
    for x in host.xids:
        if is_hardware_xid(x.code) and (since_epoch is None or x.epoch > since_epoch):
            seen[(x.code, x.pci)] = None
    out += [f"Xid {code} on PCI {pci} (hardware/driver error in the kernel log)"
            for code, pci in seen]
    return out


def judge(host: HostResult, *, expected_gpus: int | None,
          since_epoch: float | None) -> HostResult:
    """The host, made ``faulty`` where its past says so; a host that could not be judged
    (unreachable, error) or is already faulty is returned as it is."""
    if host.status not in (HostStatus.CLEAN, HostStatus.DIRTY):
        return host
    faults = history_faults(host, expected_gpus=expected_gpus, since_epoch=since_epoch)
    if not faults:
        return host
    error = "; ".join(faults + ([host.error] if host.error else []))
    folded = "; ".join([*faults, host.error_folded]) if host.error_folded else None
    return replace(host, status=HostStatus.FAULTY, error=error, error_folded=folded)


def expected_from(value: object) -> int | None:
    """An inventory ``expected_gpus`` as a count; None when unset or not a number."""
    if isinstance(value, bool) or value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        return None

