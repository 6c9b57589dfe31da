"""What a teardown that lost its controller did on its own, in words, from the journal the
node kept for it (lib.sh: "the journal") and sent with the host's next run.

>>> text = ("@@fleetclean\\tjournaled\\t1700000000\\n@@fleetclean\\tbegin\\t1\\tpost-extraction\\t"
...         "gpu01\\t0\\n@@fleetclean\\tstage\\t1\\tstop-server\\tsignal\\n@@fleetclean\\tgone\\t"
...         "1700000004\\n@@fleetclean\\tsignal\\t1\\t41\\tTERM\\tsglang\\t\\t\\n")
>>> print(describe(text, when=lambda t: f"t{t - 1700000000}"))  # doctest: +NORMALIZE_WHITESPACE
the post-extraction run begun here at t0 lost its controller at t4 and went on alone:
1 signal sent; it has not reached its end (still at work, or killed)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import unquote

from fleetclean.results.parse import MARKER, parse_script_output


def _local(epoch: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def describe(text: str, when: Callable[[int], str] = _local) -> str:
    """One sentence: the run, when it began and lost its controller, what it did after."""
    first: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith(MARKER + "\t"):
            fields = [unquote(f) for f in line.split("\t")[1:]]
            first.setdefault(fields[0], fields[1:])
    report = parse_script_output(text, "", None)

    def at(kind: str) -> str:
        value = (first.get(kind) or [""])[0]
        return when(int(value)) if value.isdigit() else "an unknown time"

    playbook = (first.get("begin") or ["", "a teardown"])[1]
    n = len(report.signalled)
    done = [f"{n} signal{'s' if n != 1 else ''} sent"]
    odd = [f"{s.name} {s.status}" for s in report.stages
           if s.status not in ("ok", "skipped") and "output ended" not in s.message]
    done += [f"stages: {', '.join(odd)}"] if odd else []
    if "done" not in first:
        end = "it has not reached its end (still at work, or killed)"
    elif report.error:
        end = f"it ended in error: {report.error}"
    elif report.verified is True:
        end = "it ended clean"
    elif report.verified is False:
        end = "it ended with GPUs still in use"
    else:
        end = "it ended"
    return (f"the {playbook} run begun here at {at('journaled')} lost its controller at "
            f"{at('gone')} and went on alone: {'; '.join(done)}; {end}")
