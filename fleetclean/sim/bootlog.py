"""The kernel log a simulated node boots with: what ``dmesg`` prints before any fault.

A real 8-GPU server's kernel ring buffer is not empty: its boot alone (a line or more per
CPU, memory range, PCI function, NVMe namespace and NIC queue, and the NVIDIA driver's
load) fills 100-250 KB, and the verification reads all of it for Xid lines. An empty log
hid a real cost: bash read the pipe one byte per read(2), 250,000 system calls a status
on a real node, and none here. This is a synthetic log of that size and shape (made up
here, deterministic): every line ``<level>[seconds.micro] text`` as the kernel keeps it
(what ``dmesg -r`` prints; the node's dmesg formats it with util-linux's own, at a real
log's cost), none an Xid.

>>> text = boot_log()
>>> 150_000 < len(text) < 260_000
True
>>> "NVRM: Xid" in text, text.startswith("<5>[    0.000000] Linux version")
(False, True)
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

CPUS = 224
GPU_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
NIC_BUSES = ("0c", "1d", "4b", "5e", "8c", "9d", "cb", "dc")


def _messages() -> Iterator[str]:
    yield "Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) (x86_64-linux-gnu-gcc-13)"
    yield "Command line: BOOT_IMAGE=/vmlinuz root=UUID=0f1e2d3c ro iommu=pt numa_balancing=0"
    for i in range(96):
        start = 0x100000000 + i * 0x40000000
        yield f"BIOS-e820: [mem 0x{start:016x}-0x{start + 0x3fffffff:016x}] usable"
    for cpu in range(CPUS):
        yield f"ACPI: LAPIC_NMI (acpi_id[0x{cpu:02x}] high edge lint[0x1])"
    for cpu in range(1, CPUS):
        yield f"smpboot: x86: Booting SMP configuration: node {cpu * 2 // CPUS}, CPU {cpu}"
    for cpu in range(CPUS):
        yield f"microcode: CPU{cpu}: patch_level=0x0a10114e"
        yield f"intel_rapl_common: Found RAPL domain package for CPU{cpu} (package {cpu % 2})"
    for number in range(0x100):
        yield f"pci 0000:{number:02x}:00.0: [1022:14a4] type 00 class 0x060000 conventional PCI"
        yield f"pci 0000:{number:02x}:00.0: PME# supported from D0 D3hot D3cold"
    for bus in GPU_BUSES:
        yield f"pci 0000:{bus}:00.0: [10de:2335] type 00 class 0x030200 PCIe Endpoint"
        base = int(bus, 16) << 24
        yield f"pci 0000:{bus}:00.0: BAR 0 [mem 0x{base:08x}-0x{base + 0xffffff:08x} 64bit pref]"
    for bus in NIC_BUSES:
        for queue in range(63):
            yield f"mlx5_core 0000:{bus}:00.0: mlx5_pcie_event: queue {queue} vector ready"
    for disk in range(8):
        yield f"nvme nvme{disk}: 128/0/0 default/read/poll queues"
        for part in range(1, 4):
            yield f" nvme{disk}n1: p{part}"
    yield "nvidia: loading out-of-tree module taints kernel."
    yield "nvidia-nvlink: Nvlink Core is being initialized, major device number 510"
    for bus in GPU_BUSES:
        yield f"nvidia 0000:{bus}:00.0: enabling device (0000 -> 0002)"
    yield "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04"
    yield "nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64"
    yield "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from nvidia.ko"
    for unit in range(120):
        yield f"systemd[1]: Started unit-{unit:03d}.service - boot-time service {unit}."


@cache
def boot_log() -> str:
    """The whole log, a line each, stamped from 0 s to about 40 s (made once a process:
    every node of a fleet gets the same): the kernel's banner at level 5 (notice), as
    init/main.c prints it, the rest at 6 (info)."""
    lines = list(_messages())
    step = 40.0 / len(lines)
    return "".join(f"<{5 if i == 0 else 6}>[{i * step:12.6f}] {text}\n"
                   for i, text in enumerate(lines))
