"""A status script's library cut in two: what a node with idle GPUs runs, which bash parses
as it reads the script, and the rest, which it parses only if something calls it.

bash parses every function it is sent before it runs any: a status script's 35 KB of
definitions cost 2.25 ms of the node's CPU (``perf stat``, 20-30 runs), yet a node whose
GPUs are idle (most of a fleet, most of the time) calls 27 of its 66 functions, 14 KB of
it. The rest (naming a GPU's holders and their owners, looking through descriptors,
reading Xids) comes after the script's ``fc_main </dev/null`` and an ``exit``, where bash
never parses it, and each of its functions is a one-line stand-in until then: the first
call of any (``fc_lazy``) parses the whole rest from the script's own text (``FC_SRC``
where ``transport.boot`` or ``render.read_whole`` read it, the ``-c`` string, or the file),
and the stand-ins are replaced by what they stood for. An idle node then pays the
stand-ins; a busy one pays them and the definitions it needs at the first call.

Only a script without stages is cut (``render.Renderer``): a teardown runs most of its
library on any node, and it calls some of it in subshells (``< <(fc_open_fds ..)``),
where a first call would parse the rest once a subshell.

>>> idle, rest = split("a() {\\n    b\\n}\\nX=1\\nb() {\\n    :\\n}\\n", frozenset({"a"}))
>>> print(idle, end="")
a() {
    b
}
X=1
b() { fc_lazy b; b "$@"; }
>>> print(rest, end="")
b() {
    :
}
"""

from __future__ import annotations

import re

# What a status on a node whose eight GPUs are idle calls (a function trace of the
# rendered script in a simulated node: tests/engine/test_lazy.py fails when it calls any
# other).
IDLE = frozenset({
    "fc_begin", "fc_finish", "fc_flush", "fc_hold", "fc_lines", "fc_now_us", "fc_read_fd",
    "fc_read_stat", "fc_rec", "fc_release", "fc_reset_opts", "fc_self_init", "fc_verify",
    "fc_verify_apps_close", "fc_verify_early_q", "fc_verify_end", "fc_verify_gate",
    "fc_verify_gpu_info", "fc_verify_gpu_info_all", "fc_verify_gpu_info_load",
    "fc_verify_read", "fc_verify_read_q", "fc_verify_rows_out", "fc_verify_state",
    "fc_verify_xid_text", "fc_verify_xids",
})

# The first line of what comes after the script's end: fc_lazy checks it is there.
MARK = "# fleetclean: definitions parsed at their first call (fc_lazy)\n"

# A function of the packaged bash: its name line at the start of a line, its closing
# brace alone on one (tests/engine/test_lazy.py holds every packaged file to it).
_FUNCTION = re.compile(r"^([A-Za-z_]\w*)\(\) \{\n.*?^\}\n", re.M | re.S)


def split(library: str, idle: frozenset[str] = IDLE) -> tuple[str, str]:
    """(what bash parses as it reads, what it parses at a first call): every function not
    in ``idle`` moves to the second, a stand-in left in its place; the rest stays as it is."""
    rest: list[str] = []

    def stand_in(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in idle:
            return m.group(0)
        rest.append(m.group(0))
        return f'{name}() {{ fc_lazy {name}; {name} "$@"; }}\n'

    return _FUNCTION.sub(stand_in, library), "".join(rest)


def loader(rest: str) -> str:
    """``fc_lazy``, for a script that ends with ``MARK`` and ``rest``: it finds that end in
    the script's text and parses it (once; its functions replace their stand-ins). The
    text is the one bash ran: ``FC_SRC`` where the script read itself (but not one from
    the environment), else the ``-c`` string, else the file; its last newline, which
    ``bash -c "$(cat FILE)"`` loses, does not count. A stand-in that is still one after
    (the end cut off or changed) stops the script rather than call itself for ever.

    >>> 'eval "${src:${#src}-64}"' in loader("f\\n")
    True
    """
    assert rest.endswith("\n")
    size = len((MARK + rest).encode()) - 1
    return f"""fc_lazy() {{
    local src=${{BASH_EXECUTION_STRING:-}}
    if [[ -z ${{FC_LAZY_DONE:-}} ]]; then
        FC_LAZY_DONE=1
        if [[ -n ${{FC_SRC:-}} && ${{FC_SRC@a}} != *x* ]]; then
            src=$FC_SRC
        elif [[ -z $src ]]; then
            {{ IFS= read -r -d '' src <"${{BASH_SOURCE[-1]}}"; }} 2>/dev/null
        fi
        [[ ${{src: -1}} != $'\\n' ]] || src=${{src:0:${{#src}}-1}}
        if [[ ${{src:${{#src}}-{size}:{len(MARK) - 1}}} == {_quoted(MARK[:-1])} ]]; then
            eval "${{src:${{#src}}-{size}}}"
            return 0
        fi
    fi
    fc_flush
    echo "fleetclean: $1 is not defined: the end of the script is missing or changed" >&2
    exit 3
}}
"""


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
