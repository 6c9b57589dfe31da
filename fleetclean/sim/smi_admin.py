"""``nvidia-smi --gpu-reset`` and ``-pm``: the fake's two state-changing commands.

Standard library only (see ``smi_state``). A reset frees what leaked on a GPU and is
refused, with the real message and exit status 255, while any process holds that GPU's
``/dev/nvidiaN``; nvidia-persistenced's handles count unless the node's ``reset_policy``
is ``lenient`` (drivers differ). Only root may reset or change persistence mode (exit 4).
``-pm 0|1`` records the mode and tells a running nvidia-persistenced (SIGHUP, found by its
pid file), which closes or reopens its handles; the command returns once it has.
"""

from __future__ import annotations

import os
import signal
import time

if __package__:
    from fleetclean.sim import smi_state
    from fleetclean.sim.smi_state import Usage
else:  # inside a node: a script, its siblings found through sys.path[0]
    import smi_state  # type: ignore[import-not-found,no-redef]
    from smi_state import Usage  # type: ignore[no-redef]

PERSISTENCED_PID = "/run/nvidia-persistenced/nvidia-persistenced.pid"
IN_USE = (
    "{n} {devices} currently being used by one or more other processes (e.g., Fabric "
    "Manager, CUDA application, graphics application such as an X server, or a monitoring "
    "application such as another instance of nvidia-smi). Please first kill all processes "
    "using {these} and all compute applications running in the system.\n"
)

Gpu = dict[str, object]


def _root(action: str, gpus: list[Gpu]) -> None:
    if os.geteuid() != 0:
        lines = [
            f"Unable to {action} for GPU {g['bus_id']}: Insufficient Permissions" for g in gpus
        ]
        raise Usage("\n".join([*lines, "Terminating early due to previous errors."]), 4)


def blocking_holders(index: int) -> list[int]:
    """PIDs whose handles on GPU ``index`` stop a reset on this node's driver."""
    lenient = smi_state.read_text("reset_policy") == "lenient"
    return [
        pid
        for gpu, pid, _ in smi_state.device_holders()
        if gpu == index and not (lenient and smi_state.comm(pid) == smi_state.PERSISTENCED_COMM)
    ]


def reset(gpus: list[Gpu]) -> tuple[str, int]:
    """``nvidia-smi -r [-i N]``: every selected GPU (all without -i) reset, or none when
    one is in use."""
    _root("reset GPU", gpus)
    busy = [g for g in gpus if blocking_holders(int(str(g["index"])))]
    if busy:
        n = len(busy)
        lines = ["The following GPUs could not be reset:"]
        lines += [f"  GPU {g['bus_id']}: In use by another client" for g in busy]
        text = (
            "\n".join(lines)
            + "\n\n"
            + IN_USE.format(
                n=n,
                devices="device is" if n == 1 else "devices are",
                these="this device" if n == 1 else "these devices",
            )
        )
        return text, 255
    # A real reset takes seconds; the node may be told how many (fault reset-delay).
    time.sleep(float(smi_state.read_text("reset_delay") or 0))
    leaked = smi_state.leaks()
    for gpu in gpus:
        leaked.pop(int(str(gpu["index"])), None)
    smi_state.write_json("leaks.json", {str(k): v for k, v in leaked.items()})
    return "".join(f"GPU {g['bus_id']} was successfully reset.\n" for g in gpus), 0


def persistence_mode(gpus: list[Gpu], value: str) -> tuple[str, int]:
    """``nvidia-smi -pm 0|1 [-i N]``."""
    if value not in ("0", "1", "ENABLED", "DISABLED"):
        raise Usage(f'Invalid value "{value}" for persistence mode.', 2)
    on = value in ("1", "ENABLED")
    _root("set persistence mode", gpus)
    modes = smi_state.persistence()
    for gpu in gpus:
        modes[int(str(gpu["index"]))] = on
    smi_state.write_json("persistence.json", {str(k): v for k, v in modes.items()})
    tell_persistenced({int(str(g["index"])) for g in gpus}, on)
    word = "Enabled" if on else "Disabled"
    lines = [f"{word} persistence mode for GPU {g['bus_id']}." for g in gpus]
    return "\n".join([*lines, "All done."]) + "\n", 0


def tell_persistenced(indexes: set[int], on: bool, timeout: float = 5.0) -> None:
    """SIGHUP to the running daemon, then wait until its handles match the new modes."""
    try:
        with open(PERSISTENCED_PID) as f:
            pid = int(f.read().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = {gpu for gpu, holder, _ in smi_state.device_holders() if holder == pid}
        if all((i in held) == on for i in indexes):
            return
        time.sleep(0.01)
