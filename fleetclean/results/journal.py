"""What a teardown that lost its controller did on its own, in words, from the journal the
node kept for it (lib.sh: "the journal") and sent with the host's next run.

>>> rec = lambda *f: "@@fleetclean\\t" + "\\t".join(f) + "\\n"
>>> text = (rec("journaled", "1700000000") + rec("begin", "1", "post-extraction", "gpu01", "0")
...         + rec("stage", "1", "stop-server", "signal") + rec("signal", "1", "41", "TERM", "x")
...         + rec("gone", "1700000004") + rec("signal", "1", "41", "KILL", "x"))
>>> print(describe(text, "running", when=lambda t: f"t{t - 1700000000}"))
... # doctest: +NORMALIZE_WHITESPACE
the post-extraction run begun here at t0 lost its controller at t4 and went on alone
(2 signals sent in all, 1 after that); it is still at work

A run whose end its controller did not hear, though the node saw no sign of it (lib.sh:
"heard"; :mod:`fleetclean.results.unheard`), has no "gone" line:

>>> print(describe(text.replace(rec("gone", "1700000004"), "") + rec("done"),
...                when=lambda t: f"t{t - 1700000000}"))
... # doctest: +NORMALIZE_WHITESPACE
the post-extraction run begun here at t0 went on unheard by its controller (2 signals
sent); it ended
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import unquote

from fleetclean.results.parse import MARKER, parse_script_output

_GONE = f"\n{MARKER}\tgone\t"


def _local(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def describe(text: str, state: str = "", when: Callable[[int], str] = _local) -> str:
    """One sentence: the run, when it began and lost its controller, what it did in all and
    after that, and how it ended (``state`` "running": it still holds the host's lock)."""
    first: dict[str, list[str]] = {}
    for line in text.split("\n"):  # records: results/parse.py _records says why
        if line.startswith(MARKER + "\t"):
            fields = [unquote(f) for f in line.split("\t")[1:]]
            first.setdefault(fields[0], fields[1:])
    report = parse_script_output(text, "", None)
    after = text.partition(_GONE)[2].count(f"\n{MARKER}\tsignal\t")

    def at(kind: str) -> str:
        value = (first.get(kind) or [""])[0]
        return when(int(value)) if value.isdigit() else "an unknown time"

    playbook = (first.get("begin") or ["", "a teardown"])[1]
    n = len(report.signalled)
    gone = "gone" in first
    did = f"{n} signal{'s' if n != 1 else ''} sent" + (
        f" in all, {after} after that" if gone else "")
    odd = [f"{s.name} {s.status}" for s in report.stages
           if s.status not in ("ok", "skipped") and "output ended" not in s.message]
    did += f"; stages: {', '.join(odd)}" if odd else ""
    if state == "running":
        end = "it is still at work"
    elif "done" not in first:
        end = "it stopped before its end (killed, or the node went down)"
    elif report.error:
        end = f"it ended in error: {report.error}"
    elif report.verified is True:
        end = "it ended clean"
    elif report.verified is False:
        end = "it ended with GPUs still in use"
    else:
        end = "it ended"
    if not gone:  # kept as "heard", asked for by a controller that did not hear its end
        return (f"the {playbook} run begun here at {at('journaled')} went on unheard by its "
                f"controller ({did}); {end}")
    return (f"the {playbook} run begun here at {at('journaled')} lost its controller at "
            f"{at('gone')} and went on alone ({did}); {end}")
