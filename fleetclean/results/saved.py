"""Saved output of a fan-out tool (or an epilog's log) -> each host's record lines. Pure.

``fleetclean export script`` runs everywhere through the tool a cluster already has, and
``fleetclean report`` reads back what it printed (stdout and stderr together):

=========  ===========================================================================
clush      ``clush -b``: blocks under a ``----`` / NODESET / ``----`` header (hosts whose
           output was the same share one block); without ``-b``: ``HOST: line``
pdsh       ``HOST: line``; pdsh's own ``pdsh@HERE: HOST: ssh exited with exit code N``
srun       ``srun -l``: ``TASK: line``; the host is the one the task's records name
raw        the record stream itself (an epilog's log, ``ssh HOST bash -s < FILE``); the
           host is the one the records name; a log of many runs keeps each host's last
=========  ===========================================================================

A host's lines that are not records (``ssh: connect to host ... Connection refused``)
are kept as its ``notes``: for a host that printed no record they say why.

>>> text = "node01: @@fleetclean\\tbegin\\t1\\tstatus\\tnode01\\t1\\n" \\
...        "node02: ssh: connect to host node02 port 22: Connection refused\\n" \\
...        "pdsh@laptop: node02: ssh exited with exit code 255\\n"
>>> detect(text)
'pdsh'
>>> [(o.host, len(o.records), o.notes) for o in split(text, "pdsh")]
... # doctest: +NORMALIZE_WHITESPACE
[('node01', 1, []),
 ('node02', 0, ['ssh: connect to host node02 port 22: Connection refused',
                'ssh exited with exit code 255'])]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from fleetclean.nodeset import expand
from fleetclean.transport.boot import CUT_SHORT, explained

MARKER = "@@fleetclean\t"
SOURCES = ("clush", "pdsh", "srun", "raw")

_SEPARATOR = re.compile(r"-{3,}$")
_BLOCK_HEAD = re.compile(r"^(\S+?)(?: \((\d+)\))?$")
_PREFIXED = re.compile(r"^([^\s:@]+): (.*)$")
_TASK = re.compile(r"^\s*(\d+): (.*)$")
_TOOL = re.compile(r"^(?:pdsh@\S+|clush|srun: error): (.*)$")
_SRUN_TASK = re.compile(r"^([^\s:]+): tasks? ([\d,-]+): (.*)$")


@dataclass
class HostOutput:
    """One host's record lines (its last run's) and its other lines."""

    host: str
    records: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def detect(text: str) -> str:
    """Which tool printed ``text``: the first record line (or clush's block header) says."""
    lines = _lines(text)
    if any(_block_at(lines, i) for i in range(len(lines))):
        return "clush"
    for line in lines:
        if line.startswith(MARKER):
            return "raw"
        if MARKER in line:
            return "srun" if _TASK.match(line) else "pdsh"
    return "raw"


def split(text: str, source: str) -> list[HostOutput]:
    """Every host ``text`` has lines of, in the order they first appear."""
    lines = _lines(text)
    if source == "srun":
        return _by_task(lines)
    if source == "raw":
        return _by_begin(lines)
    return _by_prefix(lines, blocks=source == "clush")


def _lines(text: str) -> list[str]:
    # A progress meter rewrites its line with CR (clush's "1/2 write..."): keep what is
    # left once it is done, and drop the meter glued before a header it did not end.
    out = []
    for raw in text.split("\n"):  # records: results/parse.py _records says why
        line = raw.rsplit("\r", 1)[-1]
        # A record's trailing tabs are empty fields (a "left" process with no command
        # line): stripped, the record lost them and was dropped. Other lines lose their
        # trailing blanks, which a tool pads its lines with.
        line = line if line.startswith(MARKER) or MARKER + "\t" in line else line.rstrip()
        m = re.match(r"^clush: \d+/\d+(?: gw \d+)?(.*)$", line)
        if m:
            line = m.group(1)
        out.append(line)
    return out


def _block_at(lines: list[str], i: int) -> bool:
    return (i + 2 < len(lines) and bool(_SEPARATOR.search(lines[i]))
            and bool(_SEPARATOR.fullmatch(lines[i + 2])) and bool(_BLOCK_HEAD.match(lines[i + 1])))


class _Hosts:
    """Host outputs by name, in order of first appearance."""

    def __init__(self) -> None:
        self.by_name: dict[str, HostOutput] = {}

    def get(self, name: str) -> HostOutput:
        return self.by_name.setdefault(name, HostOutput(name))

    def outputs(self) -> list[HostOutput]:
        """Sorted as people number nodes (node2 before node10), whatever order the tool
        printed them in (pdsh: as they finished)."""
        runs = [_last_run(o) for o in self.by_name.values()]
        return sorted(runs, key=lambda o: [int(w) if w.isdigit() else w
                                           for w in re.split(r"(\d+)", o.host)])


def _by_prefix(lines: list[str], *, blocks: bool) -> list[HostOutput]:
    hosts = _Hosts()
    current: list[str] = []
    i = 0
    while i < len(lines):
        if blocks and _block_at(lines, i):
            m = _BLOCK_HEAD.match(lines[i + 1])
            try:
                current = expand(m.group(1)) if m else []
            except ValueError:
                current = [lines[i + 1]]
            i += 3
            continue
        line = lines[i]
        i += 1
        tool = _TOOL.match(line)
        m = _PREFIXED.match(tool.group(1) if tool else line)
        if line.startswith(MARKER):
            for name in current:
                hosts.get(name).records.append(line)
        elif current and not tool and m and m.group(1) not in current:
            # A block's own text ("Note: module gcc/12 loaded" from a startup file, the
            # bundle's "fleetclean: gpu01: clean" under -B), not a host's prefixed line:
            # clush prints those (stderr) before its blocks, and its own after them.
            for name in current:
                hosts.get(name).notes.append(line)
        elif m:
            # Stderr comes prefixed even under -b (clush's tree mode, pdsh, clush's own
            # "exited with exit code N"): a bundle prints nothing but records on stdout.
            out = hosts.get(m.group(1))
            (out.records if m.group(2).startswith(MARKER) else out.notes).append(m.group(2))
    return hosts.outputs()


def _by_task(lines: list[str]) -> list[HostOutput]:
    """srun -l: lines by task, each task's host named by its begin record."""
    tasks: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    for line in lines:
        m = _TASK.match(line)
        if m:
            tasks.setdefault(m.group(1), []).append(m.group(2))
            continue
        tool = _TOOL.match(line)
        failed = _SRUN_TASK.match(tool.group(1)) if tool else None
        if failed:
            notes.setdefault(failed.group(1), []).append(failed.group(3))
    hosts = _Hosts()
    for task_lines in tasks.values():
        for out in _by_begin(task_lines):
            hosts.get(out.host).records += out.records
    for name, why in notes.items():
        # srun names a node by its short name, the records by the inventory's (gpu01.lab):
        # one host, not a second one made of srun's line alone.
        full = next((h for h in hosts.by_name if h.startswith(name + ".")), name)
        hosts.get(name if name in hosts.by_name else full).notes += why
    return hosts.outputs()


def _by_begin(lines: list[str]) -> list[HostOutput]:
    """A record stream (or many, one after another): each run goes to the host its begin
    record names; lines before any begin belong to no one."""
    hosts = _Hosts()
    current: HostOutput | None = None
    for line in lines:
        if not line.startswith(MARKER):
            continue
        fields = line.split("\t")
        if fields[1] == "begin" and len(fields) > 4:
            current = hosts.get(unquote(fields[4]))
        if current is not None:
            current.records.append(line)
    return hosts.outputs()


def _last_run(out: HostOutput) -> HostOutput:
    """Only the last run of a host whose lines hold several (an epilog's log), under the
    inventory's name where the tool knew the host by a shorter one (gpu01 of gpu01.lab).

    >>> run = ["x", MARKER + "begin\\t1\\tstatus\\tgpu01.lab\\t1", MARKER + "done\\t0"]
    >>> _last_run(HostOutput("gpu01", run)).host
    'gpu01.lab'
    """
    starts = [i for i, line in enumerate(out.records) if line.startswith(MARKER + "begin\t")]
    records = out.records[starts[-1]:] if starts else out.records
    fields = records[0].split("\t") if starts else []
    named = unquote(fields[4]) if len(fields) > 4 else ""
    host = named if named.startswith(out.host + ".") else out.host
    return HostOutput(host, records, out.notes)


# What an OpenSSH client prints when it cannot run the command, as fleetclean's own
# transport would call the host (its status, see DESIGN.md); first match wins.
_SSH_FAILURES = (
    ("host_key_mismatch", ("REMOTE HOST IDENTIFICATION HAS CHANGED",
                           "Host key verification failed")),
    # ssh's own words only: a host's "bash: /shared/st.sh: Permission denied" or a command
    # that "timed out" is an error of the host, not a refused key or a network timeout.
    ("auth_failed", ("Permission denied (", "Permission denied, please try again",
                     "Too many authentication failures")),
    ("timeout", ("Connection timed out", "Operation timed out", "command timeout")),
    ("unreachable", ("Connection refused", "No route to host", "Could not resolve hostname",
                     "Name or service not known", "Network is unreachable",
                     "Connection closed by", "Connection reset")),
)


# What bash says of a script it cannot parse (bash -s, line N).
_SYNTAX_ERROR = re.compile(r"\S*bash: line \d+: (syntax error|unexpected EOF)")


def failure(notes: list[str]) -> tuple[str, str]:
    """``(status, message)`` for a host that printed no record, from what its ssh and the
    tool said about it.

    >>> failure(["ssh: connect to host node02 port 22: Connection refused",
    ...          "ssh exited with exit code 255"])
    ('unreachable', 'ssh: connect to host node02 port 22: Connection refused')
    >>> failure([])
    ('error', 'no output from this host in the saved files')
    >>> failure(["bash: line 1: syntax error near unexpected token `fi'"])[1][:92]
    'fleetclean: the script arrived cut short, nothing was run (what was left of it did not parse'
    """
    for status, needles in _SSH_FAILURES:
        for note in notes:
            if any(n in note for n in needles):
                return status, note
    said = [n for n in notes if n.strip()]
    if not said:
        return "error", "no output from this host in the saved files"
    # A bundle cut short says so last, after what bash made of the rest (a word of base64,
    # the end of a string: engine/export.py's armored): that is the line that explains.
    # Cut in a line that reads or runs it, what is left does not parse: bash stops at once
    # and says so. A bundle is shellcheck-clean as exported, so that is a cut (or changed)
    # one too, and nothing of it ran.
    for note in said:
        if note.startswith(CUT_SHORT):
            return "error", explained(note)
    for note in said:
        if _SYNTAX_ERROR.match(note):
            return "error", explained(f"{CUT_SHORT} (what was left of it did not parse: "
                                      f"{note.strip()})")
    return "error", explained(said[0])


def clock(records: list[str]) -> tuple[float, float] | None:
    """``(start, end)`` in seconds of the epoch, from a standalone run's ``clock`` record.

    >>> clock(["@@fleetclean\\tclock\\t1700000000000000\\t1700000001500000\\t0"])
    (1700000000.0, 1700000001.5)
    """
    for line in reversed(records):
        fields = line.split("\t")
        if fields[1:2] == ["clock"] and len(fields) >= 4:
            try:
                return int(fields[2]) / 1e6, int(fields[3]) / 1e6
            except ValueError:
                return None
    return None
