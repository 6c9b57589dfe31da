"""systemd unit files, the subset the simulated service manager reads. Pure, stdlib only.

A ``.service`` file is INI-like: ``[Section]`` lines, ``Key=Value`` lines (the last
assignment of a key wins, ``Environment=`` accumulates), ``#``/``;`` comments. ExecStart's
words follow systemd's quoting: double or single quotes, backslash escapes inside double
quotes. Times are seconds, or with ``ms``/``s``/``min`` units (systemd.time(7)).

>>> unit = parse('''[Service]
... ExecStart=/usr/bin/python3 /opt/serve.py "--name=a b"
... Restart=always
... RestartSec=250ms
... Environment=A=1 "B=two words"
... ''')
>>> unit.exec_start, unit.restart, unit.restart_sec, unit.environment
(['/usr/bin/python3', '/opt/serve.py', '--name=a b'], 'always', 0.25, {'A': '1', 'B': 'two words'})
>>> quote(["python3", '{"a": "b c"}'])
'python3 "{\\\\"a\\\\": \\\\"b c\\\\"}"'
>>> seconds("1min 30s"), seconds("infinity")
(90.0, inf)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

RESTART = ("no", "always", "on-failure", "on-success", "on-abnormal", "on-abort", "on-watchdog")
KILL_MODES = ("control-group", "mixed", "process", "none")


@dataclass
class UnitFile:
    """What the service manager uses of a unit (defaults as systemd's)."""

    description: str = ""
    exec_start: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    restart: str = "no"
    restart_sec: float = 0.1
    kill_mode: str = "control-group"
    kill_signal: int = 15
    timeout_stop_sec: float = 90.0
    user: str = ""
    type: str = "simple"
    pid_file: str = ""
    remain_after_exit: bool = False


def seconds(text: str) -> float:
    """systemd.time(7) spans: ``100ms``, ``2``, ``1min 30s``, ``infinity``."""
    text = text.strip()
    if text == "infinity":
        return math.inf
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*([a-z]*)", text):
        total += float(number) * units.get(unit or "s", 1.0)
    return total


def split_words(text: str) -> list[str]:
    """systemd's word splitting of ExecStart= and Environment= values."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            break
        word, i = _word(text, i)
        words.append(word)
    return words


def _word(text: str, i: int) -> tuple[str, int]:
    out: list[str] = []
    quote = ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"' and i + 1 < len(text):
                i += 1
                out.append(text[i])
            else:
                out.append(c)
        elif c in "\"'":
            quote = c
        elif c in " \t":
            break
        elif c == "\\" and i + 1 < len(text):
            i += 1
            out.append(text[i])
        else:
            out.append(c)
        i += 1
    return "".join(out), i


def quote(argv: list[str]) -> str:
    """An ExecStart= value whose words split back into ``argv``."""
    parts = []
    for word in argv:
        if word and re.fullmatch(r"[\w@%+=:,./-]+", word):
            parts.append(word)
        else:
            parts.append('"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return " ".join(parts)


def parse(text: str) -> UnitFile:
    """A unit file's text -> :class:`UnitFile`; unknown keys are ignored, as systemd
    does (with a warning in its journal)."""
    unit = UnitFile()
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        _assign(unit, section, key.strip(), value.strip())
    return unit


def _assign(unit: UnitFile, section: str, key: str, value: str) -> None:
    if section == "Unit" and key == "Description":
        unit.description = value
    if section != "Service":
        return
    if key == "ExecStart":
        unit.exec_start = split_words(value.lstrip("@-:+!"))
    elif key == "Environment":
        for word in split_words(value):
            name, _, val = word.partition("=")
            unit.environment[name] = val
    elif key == "Restart" and value in RESTART:
        unit.restart = value
    elif key == "RestartSec":
        unit.restart_sec = seconds(value)
    elif key == "KillMode" and value in KILL_MODES:
        unit.kill_mode = value
    elif key == "KillSignal":
        unit.kill_signal = _signal_number(value)
    elif key in ("TimeoutStopSec", "TimeoutSec"):
        unit.timeout_stop_sec = seconds(value)
    elif key == "User":
        unit.user = value
    elif key == "Type":
        unit.type = value
    elif key == "PIDFile":
        unit.pid_file = value
    elif key == "RemainAfterExit":
        unit.remain_after_exit = value.lower() in ("yes", "true", "1", "on")


def _signal_number(value: str) -> int:
    import signal

    if value.isdigit():
        return int(value)
    name = value if value.startswith("SIG") else "SIG" + value
    return int(getattr(signal, name, signal.SIGTERM))
