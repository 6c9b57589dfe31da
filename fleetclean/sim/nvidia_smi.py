"""Fake ``nvidia-smi`` for simulated nodes: real output formats, memory from live holders.

Runs inside a node (``/usr/local/sbin/nvidia-smi`` execs ``python3 -S -I`` on this file),
standard library only and nothing heavy imported: monitoring loops call it every few
hundred milliseconds. GPU N's used memory is the sum, over live processes that hold
``/dev/nvidiaN`` open, of ``FLEETCLEAN_SIM_GPU_MIB`` in that process's initial environment
(1024 when unset). Holding only ``/dev/nvidiactl`` uses nothing, as nvidia-persistenced.

Node facts come from ``/run/fleetclean/gpus.json`` ({"gpus": [{"index", "uuid",
"bus_id"}]}); ``/run/fleetclean/fault`` selects a failure: ``na`` (memory fields are
``[N/A]``) or ``nvml`` (``Failed to initialize NVML: Driver/library version mismatch``,
exit 18). Supported: ``--query-gpu=F,..``, ``--query-compute-apps=F,..``,
``--format=csv[,noheader][,nounits]``, ``-i/--id``, ``-L`` and the bare table.

Example: ``nvidia-smi --query-gpu=index,memory.used --format=csv,noheader`` prints
``0, 62000 MiB`` ... ``7, 0 MiB``; ``--query-gpu=bogus.field`` prints
``Field "bogus.field" is not a valid field to query.`` and exits 2.
"""

from __future__ import annotations

import json
import os
import sys
import time

NODE_DIR = "/run/fleetclean"
GPU_NAME = "NVIDIA H200"
TOTAL_MIB = 143771
RESERVED_MIB = 616
DRIVER = "580.159.04"
CUDA = "13.0"
DEFAULT_MIB = 1024
NA = "[N/A]"

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


class Usage(Exception):
    """Bad command line: message for stdout, exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def process_mib(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"FLEETCLEAN_SIM_GPU_MIB="):
                    return int(item[23:])
    except (OSError, ValueError):
        pass
    return DEFAULT_MIB


def process_name(pid: str) -> str:
    """Like nvidia-smi: the program name, i.e. the first word of the command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            first = f.read().split(b"\0")[0].split(b" ")[0].decode(errors="replace")
    except OSError:
        return "[Not Found]"
    return os.path.basename(first) or "[Not Found]"


def holders() -> list[tuple[int, int, int]]:
    """(gpu index, pid, MiB) for every live process holding /dev/nvidiaN, sorted."""
    found: list[tuple[int, int, int]] = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        gpus = set()
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/nvidia") and target[11:].isdigit():
                gpus.add(int(target[11:]))
        if gpus:
            mib = process_mib(pid)
            found.extend((gpu, int(pid), mib) for gpu in gpus)
    return sorted(found)


def load_gpus(ids: str | None) -> list[dict[str, object]]:
    with open(os.path.join(NODE_DIR, "gpus.json")) as f:
        gpus: list[dict[str, object]] = json.load(f)["gpus"]
    if ids is None:
        return gpus
    wanted = ids.split(",")
    chosen = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
    if len(chosen) != len(wanted):
        raise Usage("No devices were found", 6)
    return chosen


def read_fault() -> str:
    try:
        with open(os.path.join(NODE_DIR, "fault")) as f:
            return f.read().strip()
    except OSError:
        return "none"


def csv(
    fields: list[str],
    known: dict[str, tuple[str, str]],
    rows: list[dict[str, object]],
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
        cells = []
        for field in fields:
            if na and field in MEMORY_FIELDS:
                cells.append(NA)
            else:
                cells.append(f"{row[field]}{known[field][1] if units else ''}")
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def gpu_rows(gpus: list[dict[str, object]], used: dict[int, int]) -> list[dict[str, object]]:
    rows = []
    for gpu in gpus:
        mib = used.get(int(str(gpu["index"])), 0)
        busy = mib > 0
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
                "memory.used": mib,
                "memory.total": TOTAL_MIB,
                "memory.reserved": RESERVED_MIB,
                "memory.free": max(TOTAL_MIB - RESERVED_MIB - mib, 0),
                "utilization.gpu": 0,
                "utilization.memory": 0,
                "temperature.gpu": 41 if busy else 35,
                "power.draw": "118.40" if busy else "81.02",
                "mig.mode.current": "Disabled",
                "persistence_mode": "Enabled",
                "driver_version": DRIVER,
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
        name = process_name(str(pid))
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
    used: dict[int, int] = {}
    for index, _, mib in held:
        used[index] = used.get(index, 0) + mib
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
        name = process_name(str(pid))
        memory = NA if na else f"{mib}MiB"
        out.append(
            f"|{index:>5}{'N/A':>6}{'N/A':>5}{pid:>17}{'C':>7}   {name:<33.33}{memory:>12} |"
        )
    out.append(WIDE)
    return "".join(line + "\n" for line in out)


def parse(argv: list[str]) -> dict[str, str]:
    """argv -> {option: value}; accepts ``--opt=value``, ``--opt value`` and ``-i N``."""
    opts: dict[str, str] = {}
    aliases = {"-i": "--id", "--id": "--id"}
    with_value = {"--query-gpu", "--query-compute-apps", "--format", "--id"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        key = aliases.get(key, key)
        if key in with_value:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise Usage(f'Option "{arg}" requires a value.', 2)
                value = argv[i]
            opts[key] = value
        elif arg in ("-L", "--list-gpus"):
            opts["-L"] = ""
        elif arg.startswith("-i") and arg[2:]:
            opts["--id"] = arg[2:]
        else:
            raise Usage(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n",
                2,
            )
        i += 1
    return opts


def run(argv: list[str]) -> tuple[str, int]:
    """(stdout text, exit status) for one invocation."""
    fault = read_fault()
    if fault == "nvml":
        return "Failed to initialize NVML: Driver/library version mismatch\n", 18
    try:
        opts = parse(argv)
        gpus = load_gpus(opts.get("--id"))
        fmt = set(opts.get("--format", "csv").split(","))
        na = fault == "na"
        if "--query-gpu" in opts:
            used: dict[int, int] = {}
            for index, _, mib in holders():
                used[index] = used.get(index, 0) + mib
            fields = [f.strip() for f in opts["--query-gpu"].split(",")]
            return csv(fields, GPU_FIELDS, gpu_rows(gpus, used), fmt, na), 0
        if "--query-compute-apps" in opts:
            fields = [f.strip() for f in opts["--query-compute-apps"].split(",")]
            return csv(fields, APP_FIELDS, app_rows(gpus, holders()), fmt, na), 0
        if "-L" in opts:
            return "".join(f"GPU {g['index']}: {GPU_NAME} (UUID: {g['uuid']})\n" for g in gpus), 0
        wanted = {int(str(g["index"])) for g in gpus}
        held = [h for h in holders() if h[0] in wanted]
        return table(gpus, held, na), 0
    except Usage as exc:
        return exc.message + "\n", exc.status


def main() -> int:
    text, status = run(sys.argv[1:])
    sys.stdout.write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
