"""A status script's library in three parts: what a node with idle GPUs runs, which bash
parses as it reads the script; what a node with busy GPUs adds; and the rest. bash parses
the last two only if something calls them.

bash parses every function it is sent before it runs any: a status script's definitions
(35 KB then, 45 KB and 89 functions now) cost 2.25 ms of the node's CPU (``perf stat``, 20-30
runs), yet a node whose GPUs are idle (most of a fleet, most of the time) calls about a
third of its functions, under half of its text (:func:`tiers`: only one of the two first GPU
reads is its, as its kernel's count of CUDA processes picks). The others come after the
script's ``fc_main </dev/null`` and an ``exit``, where bash never parses them, in two
groups: naming a busy GPU's processes and their owners (what a status on a busy node runs,
and one whose host's last status named processes, while its GPU read runs: 17 KB), then the
rarer rest (looking through descriptors for a holder nvidia-smi does not list, reading Xids,
the CSV queries, the other first read: 11-14 KB). Each of their functions is a one-line
stand-in until then: its first call (``fc_lazy GROUP``) parses its group from the script's
own text (``FC_SRC`` where ``transport.boot`` or ``render.read_whole`` read it, the file, or
the ``-c`` string), and the group's stand-ins are replaced by what they stood for.

Only a script without stages is cut (``render.Renderer``): a teardown runs most of its
library on any node, and it calls some of it in subshells (``< <(fc_open_fds ..)``),
where a first call would parse a group once a subshell.

>>> now, later = split("a() {\\n    b\\n}\\nX=1\\nb() {\\n    :\\n}\\n", (frozenset({"a"}),))
>>> print(now, end="")
a() {
    b
}
X=1
b() { fc_lazy 1 b; b "$@"; }
>>> later
['b() {\\n    :\\n}\\n']
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# What a status on a node whose eight GPUs are idle calls, and what it adds where they are
# busy (function traces of the rendered script in a simulated node, with an SGLang tp8
# server: tests/engine/test_lazy.py fails when a status calls any other).
IDLE = frozenset({
    "fc_begin", "fc_finish", "fc_flush", "fc_hold", "fc_lines", "fc_now_us", "fc_read_fd",
    "fc_smi_read", "fc_smi_take",
    # Where the kernel log cannot rule a pending remap out, the remapper is read beside.
    "fc_smi_start",
    "fc_put", "fc_write", "fc_rec", "fc_release", "fc_reset_opts", "fc_verify",
    "fc_verify_apps_close", "fc_verify_early_q", "fc_verify_end", "fc_verify_gate",
    "fc_verify_gpu_info", "fc_gpu_info_all", "fc_gpu_info_load", "fc_bus_dir",
    "fc_info_line",
    "fc_verify_read", "fc_verify_read_q", "fc_verify_rows_out", "fc_verify_state",
    # A node that counts no CUDA process reads its GPUs with --query-gpu (render.early_reads).
    "fc_verify_read_gpus", "fc_verify_gpu_row", "fc_rec_each",
    "fc_verify_xid_text", "fc_verify_xids",
    # A node that counts CUDA processes readies the busy tier while its -q read runs.
    "fc_verify_warm",
    # A scoped status (--user) says its scope first, idle or not.
    "fc_scope_begin",
    # Every status looks for what a teardown that lost its controller left (lib.sh).
    "fc_journal_look", "fc_lock_dir", "fc_own_dir",
})
BUSY = frozenset({
    "fc_cmdline", "fc_owner", "fc_owner_ancestry", "fc_owner_cgroup", "fc_owner_cgroup_rules",
    "fc_owner_path", "fc_owner_records", "fc_owner_roots", "fc_proc_fill", "fc_proc_load",
    "fc_protected", "fc_user_name", "fc_user_name_local", "fc_verify_all_kept",
    "fc_verify_all_stuck", "fc_still_stuck",
    # A process whose main thread ended while another lives on is read by that thread.
    "fc_live_thread",
    # Who the script is (its ancestors, its session), read at the first fc_protected.
    "fc_self", "fc_self_init", "fc_read_stat",
    "fc_verify_apps", "fc_apps_trusted", "fc_apps_pairs", "fc_verify_apps_named",
    # A node read with --query-gpu asks for the apps where a GPU is in use all the same.
    "fc_smi", "fc_smi_lines",
    "fc_verify_explain",
    "fc_verify_proc", "fc_verify_report",
    "fc_verify_settled", "fc_verify_proc_read", "fc_verify_why", "fc_owner_prep",
    # Another user's process (the simulator's are root's, which /proc's owner tells).
    "fc_proc_uids", "fc_proc_field",
    # A process of a tmux or screen session: its session's name, from its environment; a
    # Slurm job's process outside its job's cgroup, while the job runs.
    "fc_owner_env", "fc_owner_job_runs",
    # A host whose last status named processes reads them while its GPU read runs.
    "fc_verify_prep", "fc_verify_prep_awake", "fc_verify_prep_check",
})
TIERS = (IDLE, BUSY)
# A script's first GPU read is one of two (render.early_reads), as the node's count of CUDA
# processes says: -q, GPUs and processes, and the driver's files; or --query-gpu. Neither
# calls the other's functions. A host whose last status named processes reads -q whatever
# the count (the query's functions left with the rarer rest: 2 KB); on a host seen clean
# last time, the node most likely has no CUDA process, and -q's functions (4.4 KB, 0.45 ms
# of its CPU, perf stat) are parsed with the busy tier's where it does; any other host
# parses both reads' as it reads the script.
Q_READ = frozenset({"fc_verify_read_q", "fc_verify_gpu_info", "fc_gpu_info_all", "fc_bus_dir",
                    "fc_gpu_info_load", "fc_info_line"})
QUERY_READ = frozenset({"fc_verify_read_gpus", "fc_verify_gpu_row"})


def tiers(last_clean: bool = False, named: bool = False) -> tuple[frozenset[str], ...]:
    """The tiers of a status script whose host was never seen, or was seen clean at its
    last status (``last_clean``), or whose last status named processes (``named``).

    >>> new, seen, named = tiers()[0], tiers(last_clean=True), tiers(named=True)[0]
    >>> "fc_verify_read_q" in new, "fc_verify_read_gpus" in new
    (True, True)
    >>> "fc_verify_read_q" in seen[0], "fc_verify_read_q" in seen[1], "fc_verify_read_gpus" in named
    (False, True, False)
    """
    if named:
        return (IDLE - QUERY_READ, BUSY)
    if last_clean:
        return (IDLE - Q_READ, BUSY | Q_READ)
    return TIERS


# A function of the packaged bash: its name line at the start of a line, its closing
# brace alone on one (tests/engine/test_lazy.py holds every packaged file to it).
_FUNCTION = re.compile(r"^([A-Za-z_]\w*)\(\) \{\n.*?^\}\n", re.M | re.S)


def mark(group: int) -> str:
    """The first line of a group after the script's end: fc_lazy checks it is there."""
    return f"# fleetclean: definitions parsed at their first call (fc_lazy {group})\n"


def split(library: str, tiers: Sequence[frozenset[str]] = TIERS) -> tuple[str, list[str]]:
    """(what bash parses as it reads, the groups it parses at a first call): a function in
    the first tier stays, one in the Nth moves to group N-1, any other to the last group,
    a stand-in left in its place; what is not a function stays as it is."""
    groups: list[list[str]] = [[] for _ in tiers]

    def stand_in(m: re.Match[str]) -> str:
        name = m.group(1)
        group = next((i for i, tier in enumerate(tiers) if name in tier), len(tiers))
        if group == 0:
            return m.group(0)
        groups[group - 1].append(m.group(0))
        return f'{name}() {{ fc_lazy {group} {name}; {name} "$@"; }}\n'

    return _FUNCTION.sub(stand_in, library), ["".join(g) for g in groups]


def end(groups: Sequence[str]) -> str:
    """What follows the script's ``exit``: each group after its mark, in order."""
    return "".join(mark(i) + text for i, text in enumerate(groups, 1))


def loader(groups: Sequence[str]) -> str:
    """``fc_lazy GROUP NAME``, for a script that ends with ``end(groups)``: it finds the
    group in the script's text and parses it (once; its functions replace their
    stand-ins). The text is the one bash ran, the first of these whose group's mark is
    where the group's should be: ``FC_SRC`` where the script read itself (but not one from
    the environment), the file (run, or sourced by a ``-c`` string: a function's
    outermost source, which under ``-c`` and ``-s`` is no file's name, unless a file in
    the working directory happens to be called ``environment`` or ``main``), the ``-c``
    string; kept for the next group's call. Its last newline, which ``bash -c "$(cat
    FILE)"`` loses, does not count. A stand-in that is still one after (the end cut off
    or changed) stops the script rather than call itself for ever.

    >>> text = loader(["f() {\\n}\\n", "g() {\\n}\\n"])  # 73 bytes with its mark, 72 without
    >>> "1) first=$((${#text} - 145)) size=73 ;;" in text, "2) first=$((${#text} - 72))" in text
    (True, True)
    """
    sizes = [len((mark(i) + text).encode()) for i, text in enumerate(groups, 1)]
    sizes[-1] -= 1  # its last newline
    arms = "".join(f"                {i}) first=$((${{#text}} - {sum(sizes[i - 1:])})) "
                   f"size={sizes[i - 1]} ;;\n" for i in range(1, len(groups) + 1))
    lead = len(mark(0)) - 3  # what every mark starts with, its group's number left out
    return f"""fc_lazy() {{
    local src text first size want={_quoted(mark(0)[:lead])}"$1)" from
    if [[ ${{FC_LAZY_DONE:-}} != *"<$1>"* ]]; then
        FC_LAZY_DONE+="<$1>"
        for from in kept own file string; do
            src=
            case $from in
                kept) src=${{FC_LAZY_SRC:-}} ;;
                own) [[ ${{FC_SRC@a}} == *x* ]] || src=${{FC_SRC:-}} ;;
                file) [[ ! -f ${{BASH_SOURCE[-1]:-}} ]] ||
                    {{ IFS= read -r -d '' src <"${{BASH_SOURCE[-1]}}"; }} 2>/dev/null ;;
                string) src=${{BASH_EXECUTION_STRING:-}} ;;
            esac
            text=${{src%$'\\n'}}
            first=-1 size=0
            case $1 in
{arms}            esac
            if ((first >= 0)) && [[ ${{text:first:${{#want}}}} == "$want" ]]; then
                FC_LAZY_SRC=$src
                eval "${{text:first:size}}"
                return 0
            fi
        done
    fi
    fc_flush
    echo "fleetclean: $2 is not defined: the end of the script is missing or changed" >&2
    exit 3
}}
unset FC_LAZY_DONE FC_LAZY_SRC
"""


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
