"""Results -> the fleet GPU table, problem lines, --check blocks and the summary line.

Given a console; never decides. The table has one row per host and one column per GPU;
hosts with identical clean rows fold into one node set (``node[01-14]``), failed hosts get a
one-line reason, and reasons that differ only by each host's own values are shown once for
all the hosts that gave them.

Past a screenful of hosts (the terminal's height, or ``NOT_A_TERMINAL_ROWS`` in a pipe or
log) the table would scroll the problems away, so the view leads with one line per status
naming its hosts as node sets, and lists in full only the hosts that are not clean and
whose GPUs were read: a host that failed before (a rack down, a fleet not yet in
known_hosts) has a row of dashes, and its status line and problem line say all it has;
``--all`` (``full=True``) lists every host whatever the count.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.text import Text

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.nodeset import fold
from fleetclean.results.grid import Grid, Justify
from fleetclean.results.jsonio import summary
from fleetclean.results.reasons import PID, as_placeholder, notes
from fleetclean.results.words import counted, plural, printable

# A log or pipe has no height; this many hosts is about what a person reads as one table.
NOT_A_TERMINAL_ROWS = 40

_STATUS_STYLE = {
    HostStatus.CLEAN: "green",
    HostStatus.DIRTY: "yellow",
    HostStatus.FAULTY: "bold magenta",  # hardware: no kill helps, unlike dirty
}


def _cell(g: GpuRow | None, *, judged: bool = True) -> Text:
    if g is None:
        return Text("-", style="dim")
    if not judged:  # outside --gpus or an epilog's job: shown, not judged
        return Text("N/A" if g.memory_used_mib is None else str(g.memory_used_mib), style="dim")
    used = g.memory_used_mib
    if used is None:
        return Text("N/A", style="magenta")
    total = g.memory_total_mib or 0
    share = used / total if total else (1.0 if used else 0.0)
    style = "green" if used == 0 else "yellow" if share < 0.05 else "red"
    return Text(str(used), style=style)


def _fold_key(h: HostResult) -> tuple[Any, ...] | None:
    if h.status is not HostStatus.CLEAN:
        return None
    return tuple((g.index, g.memory_used_mib) for g in h.gpus)


def gpu_table(result: RunResult) -> Grid:
    ncols = max((g.index + 1 for h in result.hosts for g in h.gpus), default=8)
    # Narrow on purpose: a host, 8 GPU columns of up to 6 digits and the status fit 80
    # columns, the width of the terminal an engineer ssh'd in from.
    columns: list[tuple[str, Justify]] = [("HOST", "left")]
    columns += [(f"GPU{i}", "right") for i in range(ncols)]
    columns.append(("STATUS", "left"))
    # Fold hosts whose rows are identical and clean, in the order each group first appears.
    folded: dict[tuple[Any, ...], list[HostResult]] = {}
    hosts: list[tuple[str, HostResult]] = []
    for h in result.hosts:
        key = _fold_key(h)
        if key is None:
            hosts.append((h.host, h))
            continue
        if key not in folded:
            folded[key] = []
            hosts.append(("", h))
        folded[key].append(h)
    rows = []
    for name, h in hosts:
        label = name or fold(x.host for x in folded[_fold_key(h) or ()])
        by_index = {g.index: g for g in h.gpus}
        judged = h.judged_gpus
        cells = [_cell(by_index.get(i), judged=judged is None or i in judged)
                 for i in range(ncols)]
        status = Text(h.status.value, style=_STATUS_STYLE.get(h.status, "bold red"))
        # A host's name from a saved output (report) is that file's text: escaped.
        rows.append([Text(printable(label)), *cells, status])
    return Grid(columns, rows)


def problems(result: RunResult) -> list[str]:
    """One line per distinct problem, naming every host that had it; then one line per
    distinct note (a clean host's too: a server left running is worth saying). Hosts whose
    messages differ only by each one's own values share a line, each value that differs
    written as what it is: its address as dialled (a rack down: "cannot connect to
    10.1.0.7:22: ..."), its inventory name (a timeout, a cut connection), the fingerprints
    of its host keys (a fleet not yet in known_hosts: each host has a key of its own), and
    the PIDs of its processes (each host's server has its own). Hosts with the very same
    words keep them, and share a line whatever their names.

    >>> down = [HostResult(f"gpu{i}", HostStatus.UNREACHABLE, f"cannot connect to 10.0.0.{i}:22:"
    ...                    " connection refused", where=f"10.0.0.{i}:22") for i in (1, 2)]
    >>> problems(RunResult("status", 1.0, tuple(down)))
    ['gpu[1-2]: unreachable: cannot connect to <address>:22: connection refused']
    >>> problems(RunResult("status", 1.0, tuple(down[:1])))
    ['gpu1: unreachable: cannot connect to 10.0.0.1:22: connection refused']
    """
    # First by their very words: hosts that said the same share a line even where a host's
    # name is a word of it ("sudo: a password is required" from host "a").
    said: dict[tuple[str, str], list[HostResult]] = {}
    by_note: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for h in result.hosts:
        for note, shape in zip(notes(h), notes(h, pid=as_placeholder), strict=True):
            by_note[shape].append((h.host, note))
        if h.status is not HostStatus.CLEAN:
            said.setdefault((h.status.value, h.error or ""), []).append(h)
    by_shape: dict[tuple[str, str], list[list[HostResult]]] = defaultdict(list)
    for (status, error), hosts in said.items():
        # Hosts that said the same have no values of their own in it but their PIDs (the
        # same by chance).
        shape = _shape(hosts[0]) if len(hosts) == 1 else _folded(hosts[0]) or error
        by_shape[(status, shape)].append(hosts)
    where = "--json" if result.playbook == "status" else "fleetclean history -1 --json"
    lines = []
    for (status, shape), groups in by_shape.items():
        words = _restored(shape, [g[0].error or "" for g in groups], where)
        lines.append(f"{fold(h.host for g in groups for h in g)}: {status}: {words}")
    for shape, noted in by_note.items():
        words = _restored(shape, [note for _, note in noted], where)
        lines.append(f"{fold(host for host, _ in noted)}: {words}")
    return lines


# What a folded problem line writes for each host's own value that differs.
ADDRESS, HOST, FINGERPRINT = "<address>", "<host>", "<fingerprint>"
_SLOT = re.compile(f"({re.escape(ADDRESS)}|{re.escape(HOST)}|{FINGERPRINT}|{PID})")
# OpenSSH's SHA256 fingerprint (hostkeys.fingerprint): 43 characters of unpadded base64.
_SHA256 = re.compile(r"SHA256:[A-Za-z0-9+/]{43}(?![A-Za-z0-9+/=])")
# A fingerprint in a clause that names a CA is the CA's, not the host's own key.
_CA = re.compile(r"\bCA\b")


def _restored(shape: str, said: list[str], where: str) -> str:
    """The line's words: the one message where all said the same; else the shape, with
    each placeholder that stands for the same words in every message put back (one key on
    every host: a cloned image, or a man in the middle, is worth seeing), and where the
    values left out are (``where``: each host's own key or PIDs, to act on one by one)."""
    if all(words == said[0] for words in said):
        return said[0]
    parts = _SLOT.split(shape)
    found = [re.fullmatch("".join("(.+?)" if i % 2 else re.escape(part)
                                  for i, part in enumerate(parts)), words, re.S)
             for words in said]
    if all(found):
        for i in range(1, len(parts), 2):
            values = {m.group(i // 2 + 1) for m in found if m}
            if len(values) == 1:
                parts[i] = values.pop()
    words = "".join(parts)
    hidden = [what for mark, what in ((FINGERPRINT, "key"), (PID, "PIDs")) if mark in parts[1::2]]
    return words + (f" (each host's {' and '.join(hidden)}: {where})" if hidden else "")


def _folded(h: HostResult) -> str | None:
    """The host's message with the PIDs the run knows to be its own written ``<pid>`` (its
    holders', those left to their owner, a hung nvidia-smi's: ``HostResult.error_folded``),
    where it is still the message's (a later judgement that rewrote the message,
    results/health.py, keeps it up to date; a result read back has none)."""
    folded = h.error_folded
    if not folded or not h.error:
        return None
    pattern = re.escape(folded).replace(re.escape(PID), r"[0-9]+(?:, [0-9]+)*")
    return folded if re.fullmatch(pattern, h.error) else None


def _shape(h: HostResult) -> str:
    """The host's message with its own values written as placeholders (``problems``):
    its PIDs first (``_folded``), then its key's fingerprints in a host-key problem (not
    a CA's, and not those an authentication failure names: the keys offered, which keep
    hosts apart), its address with its port, its name (not one of digits alone, which
    counts and exit statuses would match), and its address alone."""
    error = _folded(h) or h.error or ""
    if h.status is HostStatus.HOST_KEY_MISMATCH and "SHA256:" in error:
        error = _SHA256.sub(lambda m: m.group() if _CA.search(
            error[:m.start()].rpartition(";")[2]) else FINGERPRINT, error)
    if h.where:
        error = _unaddressed(error, h.where)
    if not h.host.isdigit():
        error = _swap(error, h.host, HOST)
    if h.where:
        error = _swap(error, h.where.rpartition(":")[0], ADDRESS)
    return error


def _unaddressed(error: str, where: str) -> str:
    """``error`` with the host's own "address:port" written ``<address>:port``, where it
    is not part of a longer address or port (10.0.0.1:22 in 110.0.0.1:22, 10.0.0.1:2222 or
    IPv6's 1:10.0.0.1:22)."""
    return _replaced(error, where, f"{ADDRESS}:{where.rpartition(':')[2]}", _in_address)


def _in_address(error: str, at: int, end: int) -> bool:
    return (at > 0 and (error[at - 1].isalnum() or error[at - 1] in "_.-:[")) or (
        end < len(error) and error[end].isdigit())


def _swap(error: str, word: str, placeholder: str) -> str:
    """``error`` with ``word`` (the host's address alone, or its name) written
    ``placeholder`` wherever it stands whole: not inside a longer name, address or port
    (node1 in node10, node1-bmc or node1.example.com; 10.0.0.1 in 10.0.0.12, 110.0.0.1 or
    fe80::10.0.0.1; a bracketed address, [10.0.0.1]:2222, stands whole)."""
    return _replaced(error, word, placeholder, _in_word) if word else error


def _in_word(error: str, at: int, end: int) -> bool:
    before = error[at - 1] if at else " "
    after, beyond = error[end:end + 1], error[end + 1:end + 2]
    return (before.isalnum() or before in "_.-:<") or (
        after.isalnum() or after in "_-") or (after in ".:" and beyond.isalnum())


def _replaced(error: str, word: str, placeholder: str,
              inside: Callable[[str, int, int], bool]) -> str:
    """``error`` with each ``word`` (not empty) written ``placeholder``, but where
    ``inside(error, start, end)`` finds it part of something longer. A search, not a
    pattern: one compiled a host costs 0.1 ms a host, which a --watch pays at every
    refresh."""
    parts, last, at = [], 0, error.find(word)
    while at >= 0:
        end = at + len(word)
        if inside(error, at, end):
            at = error.find(word, at + 1)
            continue
        parts += [error[last:at], placeholder]
        last = end
        at = error.find(word, end)
    return "".join(parts) + error[last:]


def check_blocks(result: RunResult) -> list[tuple[str, list[str]]]:
    """What --check found, one block per distinct list of changes, naming every host that
    gave it (as dshbak -c does); hosts with nothing to change are left out."""
    blocks: dict[tuple[str, ...], list[str]] = {}
    for h in result.hosts:
        lines = tuple(f"{s.name}: {c}" for s in h.stages for c in s.changes)
        if lines:
            blocks.setdefault(lines, []).append(h.host)
    return [(fold(hosts), list(lines)) for lines, hosts in blocks.items()]


def print_check(console: Console, result: RunResult) -> None:
    console.print("--check: nothing was changed. What each stage would do:", style="bold")
    blocks = check_blocks(result)
    if not blocks:
        checked = [h for h in result.hosts if not h.status.failed]
        text = ("nothing: every host that answered has nothing to stop, restore or remove"
                if checked else "nothing: no host could be checked (see above)")
        console.print(f"  {text}", markup=False)
    for hosts, lines in blocks:
        console.print(f"{printable(hosts)}:", style="bold", markup=False)
        for line in map(printable, lines):  # what the hosts said, escaped
            if console.is_terminal:
                console.print(f"  {line}", markup=False, no_wrap=True, overflow="ellipsis")
            else:  # a log keeps the whole command line
                console.print(f"  {line}", markup=False, soft_wrap=True)


def summary_line(result: RunResult) -> str:
    """The run in one line.

    >>> from fleetclean.models import HostResult, HostStatus, Signalled
    >>> host = HostResult("gpu01", HostStatus.CLEAN, signalled=(Signalled(7, "x", "TERM"),))
    >>> summary_line(RunResult("status", 0.25, (host,)))
    '1 host: 1 clean, 0 dirty, 0 failed in 0.25s; 1 signal sent'
    """
    s = summary(result)
    faulty = f"{s['faulty']} faulty, " if s["faulty"] else ""
    line = (
        f"{counted(s['hosts'], 'host')}: {s['clean']} clean, {s['dirty']} dirty, {faulty}"
        f"{s['failed']} failed in {result.duration_s:.2f}s"
    )
    signalled = sum(len(h.signalled) for h in result.hosts)
    if signalled:
        line += f"; {counted(signalled, 'signal')} sent"
    if result.interrupted:
        line += " (interrupted)"
    return line


def status_lines(result: RunResult) -> list[Text]:
    """One line per status, in the contract's order, naming its hosts as node sets.

    >>> hosts = [HostResult(f"node{i:02d}", HostStatus.CLEAN) for i in range(1, 4)]
    >>> hosts.append(HostResult("node04", HostStatus.UNREACHABLE, "refused"))
    >>> for line in status_lines(RunResult("status", 1.0, tuple(hosts))):
    ...     print(line.plain)
    clean        3 hosts: node[01-03]
    unreachable  1 host:  node04
    """
    by_status: dict[HostStatus, list[str]] = defaultdict(list)
    for h in result.hosts:
        by_status[h.status].append(h.host)
    shown = [s for s in HostStatus if by_status[s]]
    name_w = max((len(s.value) for s in shown), default=0)
    count_w = max((len(str(len(by_status[s]))) for s in shown), default=0)
    lines = []
    for s in shown:
        hosts = by_status[s]
        noun = f"{plural(len(hosts), 'host')}:"
        lines.append(Text.assemble((s.value.ljust(name_w), _STATUS_STYLE.get(s, "bold red")),
                                   f"  {len(hosts):>{count_w}} {noun:<6} "
                                   f"{printable(fold(hosts))}"))
    return lines


def screenful(console: Console) -> int:
    """How many hosts the table may list before the view leads with per-status lines."""
    return console.height if console.is_terminal else NOT_A_TERMINAL_ROWS


def render_result(
    result: RunResult, *, full: bool = True, max_hosts: int = NOT_A_TERMINAL_ROWS
) -> RenderableType:
    """The table, its problem lines and the summary; past ``max_hosts`` hosts (unless
    ``full``), per-status lines first and in the table only the hosts that are not clean
    and whose GPUs were read."""
    # The title is a line of its own: as a table title it would wrap to the table's width.
    title = Text(f"GPU memory used (MiB), {printable(result.playbook)}", style="bold")
    parts: list[RenderableType] = [title]
    if full or len(result.hosts) <= max_hosts:
        parts.append(gpu_table(result))
    else:
        parts += status_lines(result)
        others = tuple(h for h in result.hosts if h.status is not HostStatus.CLEAN and (
            h.gpus or not h.status.failed))
        if others:
            parts.append(gpu_table(dataclasses.replace(result, hosts=others)))
        clean = sum(h.status is HostStatus.CLEAN for h in result.hosts)
        unread = len(result.hosts) - clean - len(others)
        left = " and ".join(([counted(clean, "clean host")] if clean else []) + (
            [f"{counted(unread, 'failed host')} with no GPU read"] if unread else []))
        if left:
            parts.append(Text(f"({left} not listed: --all lists every host)", style="dim"))
    for line in problems(result):
        parts.append(Text(printable(line), style="yellow"))  # the hosts' words, escaped
    parts.append(Text(summary_line(result), style="bold"))
    return Group(*parts)


def print_result(console: Console, result: RunResult, *, full: bool = False) -> None:
    console.print(render_result(result, full=full, max_hosts=screenful(console)))
