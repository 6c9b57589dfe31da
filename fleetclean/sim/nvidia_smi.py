"""Fake ``nvidia-smi`` for simulated nodes: real output formats, memory from live holders.

Runs inside a node (``/usr/local/sbin/nvidia-smi`` execs ``python3 -S -E`` on this file),
standard library only and nothing heavy imported: monitoring loops call it every few
hundred milliseconds. GPU N's used memory is what leaked on it (``smi_state``) plus the
sum, over live processes that hold ``/dev/nvidiaN`` open, of ``FLEETCLEAN_SIM_GPU_MIB`` in
that process's initial environment (1024 when unset; 0 is a handle without a context, as
nvidia-persistenced's: not a compute app).

Faults (``smi_state`` documents the files, ``faults.FAULTS`` what each does), each with the
real tool's output and status: ``nvml`` (Driver/library version mismatch and the library's
version, exit 18), ``driver`` (NVIDIA-SMI has failed ..., exit 9), ``nodevices[:STATUS]``
(No devices were found, exit 6 or STATUS), ``nosupported`` (No supported GPUs were found,
exit 255), ``inforom:N`` (a warning, then the output, exit 14), a GPU it cannot open (its
rows replaced by ``Unable to determine the device handle ...: WORDS``, the others kept:
``smi_state.GPU_ERRORS``), ``na`` (memory fields ``[N/A]``), a GPU whose memory reads as
an error word (``smi_state.BAD_VALUES``, exit 0). Supported:
``--query-gpu=F,..``, ``--query-compute-apps=F,..``, ``--format=csv[,noheader][,nounits]``,
``-q -d MEMORY,PIDS[,ROW_REMAPPER][,PAGE_RETIREMENT]`` (:func:`details`; ``-x`` with ``-d``
is refused as the real tool refuses it, and ``-q`` without ``-d`` or another display group
is not simulated: exit 2), ``-i/--id``, ``-L``, ``-r/--gpu-reset``,
``-pm/--persistence-mode`` and the bare table.

Example: ``nvidia-smi --query-gpu=index,memory.used --format=csv,noheader`` prints
``0, 62000 MiB`` ... ``7, 0 MiB``; ``--query-gpu=bogus.field`` prints
``Field "bogus.field" is not a valid field to query.`` and exits 2.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

if __package__:
    from fleetclean.sim import smi_admin, smi_state
    from fleetclean.sim.smi_state import Usage
else:  # inside a node: a script, its siblings found through sys.path[0]
    import smi_admin  # type: ignore[import-not-found,no-redef]
    import smi_state  # type: ignore[import-not-found,no-redef]
    from smi_state import Usage  # type: ignore[no-redef]

GPU_NAME = "NVIDIA H200"
TOTAL_MIB = 143771
RESERVED_MIB = 616
DRIVER = "580.159.04"
CUDA = "13.0"
NA = "[N/A]"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
# The mismatch as nvidia-smi prints it (users' reports, not captured here): the library's
# version, major.minor, on a second line (e.g. "NVML library version: 570.124").
VERSION_MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\n"
    f"NVML library version: {'.'.join(DRIVER.split('.')[:2])}\n"
)
# No GPU bound to the driver (all on vfio-pci, say). Exit 255 is from a user's report, not
# captured here.
NO_SUPPORTED = "Failed to initialize NVML: No supported GPUs were found\n"
STUCKFS = "/run/fleetclean-stuck"  # stuckfs.MOUNTPOINT
# Whole-tool faults that end every call before NVML answers: fault -> (output, status).
NO_NVML = {"nvml": (VERSION_MISMATCH, 18), "driver": (NO_DRIVER, 9),
           "nosupported": (NO_SUPPORTED, 255)}

# query name -> (header unit, value unit); a unit is printed unless "nounits".
GPU_FIELDS = {
    "index": ("", ""),
    "count": ("", ""),
    "uuid": ("", ""),
    "gpu_uuid": ("", ""),
    "name": ("", ""),
    "gpu_name": ("", ""),
    "pci.bus_id": ("", ""),
    "gpu_bus_id": ("", ""),
    "memory.used": (" [MiB]", " MiB"),
    "memory.total": (" [MiB]", " MiB"),
    "memory.reserved": (" [MiB]", " MiB"),
    "memory.free": (" [MiB]", " MiB"),
    "utilization.gpu": (" [%]", " %"),
    "utilization.memory": (" [%]", " %"),
    "temperature.gpu": ("", ""),
    "power.draw": (" [W]", " W"),
    "mig.mode.current": ("", ""),
    "persistence_mode": ("", ""),
    "driver_version": ("", ""),
    "retired_pages.pending": ("", ""),
    "remapped_rows.pending": ("", ""),
    "remapped_rows.failure": ("", ""),
    "remapped_rows.correctable": ("", ""),
    "remapped_rows.uncorrectable": ("", ""),
}
APP_FIELDS = {
    "pid": ("", ""),
    "process_name": ("", ""),
    "name": ("", ""),
    "used_memory": (" [MiB]", " MiB"),
    "used_gpu_memory": (" [MiB]", " MiB"),
    "gpu_uuid": ("", ""),
    "gpu_bus_id": ("", ""),
    "gpu_name": ("", ""),
}
APP_HEADERS = {"used_memory": "used_gpu_memory"}
MEMORY_FIELDS = {"memory.used", "memory.free", "memory.reserved", "used_memory", "used_gpu_memory"}


def holders() -> list[tuple[int, int, int]]:
    """(gpu index, pid, MiB) of every compute app, memory leaks not included."""
    return smi_state.holders()


def csv(
    fields: list[str],
    known: dict[str, tuple[str, str]],
    rows: list[dict[str, object] | str],
    fmt: set[str],
    na: bool,
) -> str:
    for field in fields:
        if field not in known:
            raise Usage(f'Field "{field}" is not a valid field to query.\n', 2)
    units = "nounits" not in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(APP_HEADERS.get(f, f) + known[f][0] for f in fields))
    for row in rows:
        if isinstance(row, str):  # a GPU nvidia-smi could not open: its error line
            lines.append(row)
            continue
        cells = []
        for field in fields:
            value = row[field]
            if na and field in MEMORY_FIELDS:
                cells.append(NA)
            elif isinstance(value, str) and value.startswith("["):  # [N/A], [Unknown Error]
                cells.append(value)  # printed without its unit, as the real tool does
            else:
                cells.append(f"{value}{known[field][1] if units else ''}")
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def lost_line(gpu: dict[str, object], words: str = smi_state.GPU_ERRORS["lost"][1]) -> str:
    """What nvidia-smi prints for a GPU it cannot open (bus id without 4 zeros)."""
    return f"Unable to determine the device handle for GPU{str(gpu['bus_id'])[4:]}: {words}"


def gpu_rows(gpus: list[dict[str, object]], used: dict[int, int]) -> list[dict[str, object] | str]:
    rows: list[dict[str, object] | str] = []
    modes = smi_state.persistence()
    broken = smi_state.gpu_errors()
    bad = smi_state.bad_values()
    retired, remapped = smi_state.pending("retired"), smi_state.pending("remapped")
    for gpu in gpus:
        index = int(str(gpu["index"]))
        if index in broken:
            rows.append(lost_line(gpu, broken[index][1]))
            continue
        mib = used.get(index, 0)
        busy = mib > 0
        # One NVML call answers total, reserved, used and free: where it fails, all four
        # read its error word.
        memory: dict[str, object] = {
            "memory.used": mib,
            "memory.total": TOTAL_MIB,
            "memory.reserved": RESERVED_MIB,
            "memory.free": max(TOTAL_MIB - RESERVED_MIB - mib, 0),
        }
        if index in bad:
            memory = dict.fromkeys(memory, bad[index])
        rows.append(
            {
                "index": gpu["index"],
                "count": len(gpus),
                "uuid": gpu["uuid"],
                "gpu_uuid": gpu["uuid"],
                "name": GPU_NAME,
                "gpu_name": GPU_NAME,
                "pci.bus_id": gpu["bus_id"],
                "gpu_bus_id": gpu["bus_id"],
                **memory,
                "utilization.gpu": 0,
                "utilization.memory": 0,
                "temperature.gpu": 41 if busy else 35,
                "power.draw": "118.40" if busy else "81.02",
                "mig.mode.current": "Disabled",
                "persistence_mode": "Enabled" if modes.get(index, True) else "Disabled",
                "driver_version": DRIVER,
                # An H200 remaps rows, it retires no pages: [N/A] as the real one prints
                # (tests/data/nvidia-smi/h200/gpu_pending_held.txt), Yes where the fault
                # makes this GPU one that retires pages.
                "retired_pages.pending": "Yes" if index in retired else NA,
                "remapped_rows.pending": "Yes" if index in remapped else "No",
                "remapped_rows.failure": "No",
                "remapped_rows.correctable": 0,
                "remapped_rows.uncorrectable": 1 if index in remapped else 0,
            }
        )
    return rows


def app_rows(
    gpus: list[dict[str, object]], held: list[tuple[int, int, int]]
) -> list[dict[str, object]]:
    by_index = {int(str(g["index"])): g for g in gpus}
    rows: list[dict[str, object]] = []
    for index, pid, mib in held:
        gpu = by_index.get(index)
        if gpu is None:
            continue
        name = smi_state.process_name(str(pid))
        rows.append(
            {
                "pid": pid,
                "process_name": name,
                "name": name,
                "used_memory": mib,
                "used_gpu_memory": mib,
                "gpu_uuid": gpu["uuid"],
                "gpu_bus_id": gpu["bus_id"],
                "gpu_name": GPU_NAME,
            }
        )
    return rows


BAR = "+-----------------------------------------+------------------------+----------------------+"
WIDE = "+" + "-" * 89 + "+"


def table(gpus: list[dict[str, object]], held: list[tuple[int, int, int]], na: bool) -> str:
    """The bare ``nvidia-smi`` screen, column for column as driver 580 prints it."""
    used = memory_used(held)
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y") + "       ",
        WIDE,
        f"| NVIDIA-SMI {DRIVER}             Driver Version: {DRIVER}     "
        f"CUDA Version: {CUDA}     |",
        BAR,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A |"
        " Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage |"
        " GPU-Util  Compute M. |",
        "|                                         |                        |"
        "               MIG M. |",
        "|" + BAR[1:-1].replace("-", "=") + "|",
    ]
    for gpu in gpus:
        index = int(str(gpu["index"]))
        mib = used.get(index, 0)
        memory = f"{NA} / {TOTAL_MIB}MiB" if na else f"{mib}MiB / {TOTAL_MIB}MiB"
        power = 118 if mib else 81
        temp = 41 if mib else 35
        out += [
            f"| {index:>3}  {GPU_NAME:<31}On  |   {gpu['bus_id']} Off |{'0':>21} |",
            f"| N/A   {temp:>2}C    P0{f'{power}W':>16} / {'700W':>5} |{memory:>23} |"
            f"{'0':>7}%{'Default':>13} |",
            f"|{'':41}|{'':24}|{'Disabled':>21} |",
            BAR,
        ]
    out += [
        "",
        WIDE,
        f"|{' Processes:':<89}|",
        "|  GPU   GI   CI              PID   Type   Process name"
        "                        GPU Memory |",
        "|        ID   ID                                          "
        "                     Usage      |",
        "|" + "=" * 89 + "|",
    ]
    if not held:
        out.append(f"|{'  No running processes found':<89}|")
    for index, pid, mib in held:
        name = smi_state.process_name(str(pid))
        memory = NA if na else f"{mib}MiB"
        out.append(
            f"|{index:>5}{'N/A':>6}{'N/A':>5}{pid:>17}{'C':>7}   {name:<33.33}{memory:>12} |"
        )
    out.append(WIDE)
    return "".join(line + "\n" for line in out)


def memory_used(held: list[tuple[int, int, int]]) -> dict[int, int]:
    """MiB used per GPU: its compute apps' memory plus what leaked with no process."""
    used = dict(smi_state.leaks())
    for index, _, mib in held:
        used[index] = used.get(index, 0) + mib
    return used


INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
XML_WITH_DISPLAY = ("Invalid combination of input arguments: --display/-d flags can not be "
                    "combined with -x/--xml-format flags.")
WITH_VALUE = {"--query-gpu", "--query-compute-apps", "--format", "--id", "--persistence-mode",
              "--display"}
FLAGS = {"--list-gpus", "--gpu-reset", "--query", "--xml-format"}
ALIASES = {"-i": "--id", "-pm": "--persistence-mode", "-r": "--gpu-reset", "-L": "--list-gpus",
           "-q": "--query", "-d": "--display", "-x": "--xml-format"}


def parse(argv: list[str]) -> dict[str, str]:
    """argv -> {option: value}; accepts ``--opt=value``, ``--opt value`` and ``-i N``.

    >>> parse(["-pm", "0", "-i", "3"])
    {'--persistence-mode': '0', '--id': '3'}
    >>> parse(["--bogus"])
    Traceback (most recent call last):
    fleetclean.sim.smi_state.Usage: Invalid combination of input arguments. ...
    """
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        key = ALIASES.get(key, key)
        if key in WITH_VALUE:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise Usage(f'Option "{arg}" requires a value.', 2)
                value = argv[i]
            opts[key] = value
        elif key in FLAGS:
            opts[key] = ""
        elif arg.startswith("-i") and arg[2:]:
            opts["--id"] = arg[2:]
        else:
            raise Usage(INVALID, 2)
        i += 1
    return opts


def tool_fault() -> tuple[str, str]:
    """The node's whole-tool fault and its argument: ``("inforom", "0")``."""
    word, _, arg = smi_state.read_fault().partition(":")
    return word, arg


DISPLAY_GROUPS = ("MEMORY", "PIDS", "PAGE_RETIREMENT", "ROW_REMAPPER")
BAR1_MIB = 262144


def line(key: str, value: object, indent: int = 0, width: int = 55) -> str:
    """One ``-q`` line: the key padded so that the colon stands in column ``width``."""
    return f"{' ' * indent}{key}".ljust(width) + f": {value}"


def details(
    groups: set[str], gpus: list[dict[str, object]], held: list[tuple[int, int, int]], na: bool
) -> str:
    """``nvidia-smi -q -d GROUPS`` as driver 580 prints it on an H200 (the captured
    ``tests/data/nvidia-smi/h200/q_*.txt``): a header, then per GPU its bus id and the
    sections asked for, in the tool's own order, each GPU block ended by a blank line.

    A GPU nvidia-smi cannot open prints its error line instead of its block (the exit
    status says so). A GPU with retired pages pending is modelled as one without a row
    remapper (the GPUs that retire pages predate row remapping): its ``Remapped Rows``
    reads ``N/A``, a layout the status script does not take, so it reads the CSV query
    instead, which has ``retired_pages.pending``; not checked against such a GPU's real
    output. The ``na`` fault prints ``N/A`` for memory, as ``-q`` prints values it cannot
    read, and a GPU of ``smi_state.bad_values`` its FB memory's error word unbracketed in
    the same way (``GPU requires reset``); neither checked against a real fault."""
    used = memory_used(held)
    broken = smi_state.gpu_errors()
    bad = smi_state.bad_values()
    retired, remapped = smi_state.pending("retired"), smi_state.pending("remapped")
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        line("Timestamp", time.strftime("%a %b %e %H:%M:%S %Y")),
        line("Driver Version", DRIVER),
        line("CUDA Version", CUDA),
        "",
        line("Attached GPUs", len(smi_state.all_gpus())),
    ]
    for gpu in gpus:
        index = int(str(gpu["index"]))
        if index in broken:
            out.append(lost_line(gpu, broken[index][1]))
            continue
        out.append(f"GPU {gpu['bus_id']}")
        mib = used.get(index, 0)
        if "MEMORY" in groups:
            fb = [TOTAL_MIB, RESERVED_MIB, mib, TOTAL_MIB - RESERVED_MIB - mib + 1]
            bar1 = [BAR1_MIB, mib + 1, BAR1_MIB - mib - 1]
            shown = [NA[1:-1] if na and i else bad[index][1:-1] if index in bad else f"{v} MiB"
                     for i, v in enumerate(fb)]
            out += ["    FB Memory Usage",
                    *(line(k, v, 8) for k, v in zip(("Total", "Reserved", "Used", "Free"),
                                                    shown, strict=True)),
                    "    BAR1 Memory Usage",
                    *(line(k, f"{v} MiB", 8) for k, v in zip(("Total", "Used", "Free"), bar1,
                                                            strict=True)),
                    "    Conf Compute Protected Memory Usage",
                    *(line(k, "0 MiB", 8) for k in ("Total", "Used", "Free"))]
        if "PAGE_RETIREMENT" in groups:
            pages = ("0", "1", "Yes") if index in retired else ("N/A", "N/A", "N/A")
            out += ["    Retired Pages",
                    *(line(k, v, 8) for k, v in zip(
                        ("Single Bit ECC", "Double Bit ECC", "Pending Page Blacklist"), pages,
                        strict=True))]
        if "ROW_REMAPPER" in groups:
            out += remapped_rows(index in retired, index in remapped)
        if "PIDS" in groups:
            out += processes([h for h in held if h[0] == index], na)
        out.append("")
    return "".join(text + "\n" for text in out)


def remapped_rows(no_remapper: bool, pending: bool) -> list[str]:
    if no_remapper:
        return [line("    Remapped Rows", "N/A")]
    counts = ("0", "0", "1" if pending else "0", "0", "Yes" if pending else "No", "No")
    keys = ("Correctable Error", "Inactive Correctable Error", "Uncorrectable Error",
            "Inactive Uncorrectable Error", "Pending", "Remapping Failure Occurred")
    banks = (("Max", 3071 if pending else 3072), ("High", 1 if pending else 0), ("Partial", 0),
             ("Low", 0), ("None", 0))
    return ["    Remapped Rows", *(line(k, v, 8) for k, v in zip(keys, counts, strict=True)),
            "        Bank Remap Availability Histogram",
            *(line(k, f"{v} bank(s)", 12) for k, v in banks)]


def processes(held: list[tuple[int, int, int]], na: bool) -> list[str]:
    if not held:
        return [line("    Processes", "None")]
    out = ["    Processes"]
    for _, pid, mib in held:
        out += [line("GPU instance ID", "N/A", 8, 42), line("Compute instance ID", "N/A", 8, 42),
                line("Process ID", pid, 8, 42), line("Type", "C", 12, 42),
                line("Name", smi_state.process_name(str(pid)), 12, 42),
                line("Used GPU Memory", NA[1:-1] if na else f"{mib} MiB", 12, 42)]
    return out


def query(opts: dict[str, str], gpus: list[dict[str, object]], na: bool) -> tuple[str, int]:
    """--query-gpu, --query-compute-apps, -L or the table; exit 15 when a GPU is lost (8
    lacking power, 10 with an interrupt issue: the first such GPU's)."""
    broken = smi_state.gpu_errors()
    lost = [g for g in gpus if int(str(g["index"])) in broken]
    status = broken[int(str(lost[0]["index"]))][0] if lost else 0
    fmt = set(opts.get("--format", "csv").split(","))
    if "--query" in opts:
        groups = {g.strip().upper() for g in opts.get("--display", "").split(",")}
        if "--xml-format" in opts or not groups <= set(DISPLAY_GROUPS):
            raise Usage(INVALID, 2)  # the full -q, XML or other groups: not simulated
        return details(groups, gpus, holders(), na), status
    if "--query-gpu" in opts:
        fields = [f.strip() for f in opts["--query-gpu"].split(",")]
        rows = gpu_rows(gpus, memory_used(holders()))
        return csv(fields, GPU_FIELDS, rows, fmt, na), status
    if "--query-compute-apps" in opts:
        fields = [f.strip() for f in opts["--query-compute-apps"].split(",")]
        apps: list[dict[str, object] | str] = [*app_rows(gpus, holders())]
        apps += [lost_line(g, broken[int(str(g["index"]))][1]) for g in lost]
        return csv(fields, APP_FIELDS, apps, fmt, na), status
    if lost:  # the screen needs every GPU: the first broken one ends it
        return lost_line(lost[0], broken[int(str(lost[0]["index"]))][1]) + "\n", status
    if "--list-gpus" in opts:
        return "".join(f"GPU {g['index']}: {GPU_NAME} (UUID: {g['uuid']})\n" for g in gpus), 0
    wanted = {int(str(g["index"])) for g in gpus}
    held = [h for h in holders() if h[0] in wanted]
    return table(gpus, held, na), 0


def lists_processes(argv: list[str]) -> bool:
    """Whether the call asks for processes: the compute apps, -q's PIDS, the table."""
    words = " ".join(argv)
    return ("--query-compute-apps" in words or "PIDS" in words or not argv
            or not any(w.startswith("-") for w in argv))


def wedged() -> tuple[str, int]:
    """A call into a wedged driver: it waits in a request the node's stuck driver
    (``stuckfs``, which SimFleet.set_fault starts) never answers, as the real tool waits in
    an ioctl: SIGKILL leaves it in state D, holding /dev/nvidiactl. Once ``unstick`` fails
    the request (EIO), it ends as the real tool does when NVML's call fails."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write("nvidia-smi")  # the real tool's name, not this interpreter's
    with open("/dev/nvidiactl", "rb"), contextlib.suppress(OSError):
        os.stat(f"{STUCKFS}/hang-{threading.get_native_id()}")
    return "Failed to initialize NVML: Unknown Error\n", 255


def run(argv: list[str]) -> tuple[str, int]:
    """(stdout text, exit status) for one invocation."""
    fault, arg = tool_fault()
    if fault in NO_NVML:
        return NO_NVML[fault]
    if fault == "hang" and (arg != "apps" or lists_processes(argv)):
        return wedged()
    try:
        if fault == "nodevices":  # the status varies by version: the fault's argument
            raise Usage("No devices were found", int(arg) if arg.isdigit() else 6)
        opts = parse(argv)
        if "--display" in opts and "--xml-format" in opts:
            raise Usage(XML_WITH_DISPLAY, 2)
        if "--display" in opts and "--query" not in opts:
            raise Usage(INVALID, 2)
        gpus = smi_state.load_gpus(opts.get("--id"))
        if "--gpu-reset" in opts:
            return smi_admin.reset(gpus)
        if "--persistence-mode" in opts:
            return smi_admin.persistence_mode(gpus, opts["--persistence-mode"])
        text, status = query(opts, gpus, fault == "na")
        if fault == "inforom":
            bad = next((g for g in gpus if str(g["index"]) == (arg or "0")), gpus[0])
            return f"WARNING: infoROM is corrupted at gpu {str(bad['bus_id'])[4:]}\n" + text, 14
        return text, status
    except Usage as exc:
        return exc.message + "\n", exc.status
    except smi_state.DriverDown:
        return NO_DRIVER, 9


def main() -> int:
    smi_state.log_call(sys.argv[1:])
    text, status = run(sys.argv[1:])
    sys.stdout.write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
