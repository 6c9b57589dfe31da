"""Scripts that run with no fleetclean controller: a bundle for fan-out tools, an epilog.

``render_bundle``: one script for every host of an inventory (``fleetclean export script``),
which ``clush -b``, ``pdsh`` or ``srun`` run everywhere; each host runs the part rendered
with its own variables, picked by its hostname. ``render_epilog``: one script for Slurm's
``Epilog=`` (``fleetclean export slurm-epilog``), run by slurmd after every job on its node.
Both carry ``standalone.sh``: records to stdout as over SSH (and to a log), judged into the
exit status. Pure, like :mod:`.render`.

>>> from fleetclean.engine.playbook import load_playbook
>>> from fleetclean.engine.variables import resolve
>>> book = resolve(load_playbook("post-extraction"), {}, {})
>>> epilog = render_epilog(book, log="/var/log/fleetclean/epilog.log")
>>> epilog.splitlines()[-1], "fc_stage 1 job-leftovers slurm-job" in epilog
('fc_epilog_run </dev/null', True)
>>> bundle = render_bundle([("gpu01.lab", book), ("gpu02.lab", book)], playbook="post-extraction")
>>> bundle.count("fc_main_1() {"), "FC_BUNDLE_FN[gpu02]=1" in bundle
(1, True)
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import re
from collections.abc import Sequence

from fleetclean import __version__
from fleetclean.engine.model import ResolvedPlaybook, ResolvedStage, Scope
from fleetclean.engine.render import (
    CARRIED_NOTE,
    carried,
    library,
    main_function,
    variable_comments,
)
from fleetclean.engine.stages import template
from fleetclean.engine.stages.base import q
from fleetclean.nodeset import fold
from fleetclean.transport.boot import CUT_SHORT

# slurmd runs an epilog with no PATH at all; a bundle's login shell may have a short one.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_EPILOG_LOG = "/var/log/fleetclean/epilog.log"
# What a job left behind is signalled first: the leftovers of one job, not a fleet's server
# stopped by hand, so a short grace (the node is COMPLETING, taking no job, meanwhile).
JOB_STAGE = ResolvedStage("job-leftovers", "slurm-job",
                          {"match": "identity", "signal": "TERM", "grace": 3.0,
                           "kill_wait": 3.0, "tree": True})
_RUNTIME_HOST = '"$FC_TARGET_HOST"'


def render_epilog(resolved: ResolvedPlaybook, *, log: str) -> str:
    """The epilog: a ``slurm-job`` stage first (unless the playbook has one), then the
    playbook's stages and verification, scoped to the finished job."""
    if not any(s.type == "slurm-job" for s in resolved.stages):
        resolved = dataclasses.replace(resolved, stages=(JOB_STAGE, *resolved.stages))
    # The finished job's leftovers are what the epilog is for: a Slurm job owns them (its
    # cgroup outlives it under proctrack/linuxproc), so refusing them as a running job's would
    # leave them; any other job's processes are outside the epilog's scope and never touched.
    resolved = dataclasses.replace(
        resolved, owner_actions={**resolved.owner_actions, "slurm": "signal"})
    scope = Scope(slurm_job=True)
    where = "built-in" if resolved.builtin else resolved.path
    header = [
        "#!/bin/bash",
        f"# fleetclean {__version__}: Slurm epilog, playbook {resolved.name} ({where})",
        "# Install on every node (e.g. as /etc/slurm/epilog.d/50-fleetclean, mode 0755) and",
        "# name it in slurm.conf: Epilog=/etc/slurm/epilog.d/50-fleetclean; then",
        "# `scontrol reconfigure`. After every job it signals what the job left behind, runs",
        "# the stages and verifies, touching no other job's processes, and exits 0 only when",
        "# the node is clean: a non-zero exit makes Slurm drain the node ('Epilog error').",
        f"# Why, and every record, is in {log}: read it with `fleetclean report FILE`.",
        "# It needs bash, coreutils, procps and nvidia-smi; it calls no Slurm command.",
        CARRIED_NOTE,
        "# variables:",
        *variable_comments(resolved.variables),
        "",
        f"PATH={PATH}",
        "export PATH",
        f"FC_EPILOG_LOG={q(log)}",
        "",
    ]
    parts = ["\n".join(header), *library([resolved], scope), carried(template("standalone.sh"))]
    # A read-only playbook (status) makes an epilog that judges and signals nothing: it
    # drains a node its job left dirty without touching anything.
    parts.append("\n".join([*main_function(resolved, check=resolved.read_only,
                                           force=resolved.force, host=_RUNTIME_HOST,
                                           scope=scope),
                            "", "fc_epilog_run </dev/null", ""]))
    return "\n".join(parts)


def render_bundle(
    books: Sequence[tuple[str, ResolvedPlaybook]],
    *,
    playbook: str,
    check: bool = False,
    force: bool = False,
    scope: Scope | None = None,
) -> str:
    """One script for every ``(host name, resolved playbook)``; hosts whose scripts would be
    the same (same variables) share one ``fc_main_N``."""
    variants: dict[str, int] = {}
    functions: list[str] = []
    comments: list[list[str]] = []
    members: dict[int, list[str]] = {}
    variant_of: dict[str, int] = {}
    for name, book in books:
        chk = check or book.read_only
        lines = main_function(book, check=chk, force=force or book.force, host=_RUNTIME_HOST,
                              scope=scope)
        key = "\n".join(lines)
        if key not in variants:
            n = variants[key] = len(variants) + 1
            functions.append("\n".join(main_function(
                book, check=chk, force=force or book.force, host=_RUNTIME_HOST,
                name=f"fc_main_{n}", scope=scope)))
            comments.append(variable_comments(book.variables))
        members.setdefault(variants[key], []).append(name)
        variant_of[name] = variants[key]
    names = [name for name, _ in books]
    keys = {name: name for name in names} | _short_names(names)
    table = [line for key, name in keys.items()
             for line in (f"FC_BUNDLE_FN[{q(key)}]={variant_of[name]}",
                          f"FC_BUNDLE_NAME[{q(key)}]={q(name)}")]
    listed = fold(names)
    header = [
        "#!/usr/bin/env bash",
        bundle_title(playbook, names),
        "# Every host runs the part made for it, found by its hostname. Run it with one of",
        "#   clush -b -w NODES 'bash -p -s' < THIS_FILE > out.txt 2>&1   (the bundle, not --plain)",
        "#   pdsh -R ssh -w NODES \"$(cat THIS_FILE)\" > out.txt 2>&1   (--pdsh; sh, bash, zsh)",
        "#   srun -N COUNT -w NODES -l bash -p THIS_FILE > out.txt 2>&1   (on a shared filesystem)",
        "# then read what they printed: fleetclean report out.txt",
        CARRIED_NOTE,
    ]
    for n, hosts in members.items():
        header += [f"# variables of {fold(hosts)}:", *comments[n - 1]]
    header.append("")
    body = [
        "declare -A FC_BUNDLE_FN=() FC_BUNDLE_NAME=()",
        *table,
        f"FC_BUNDLE_PLAYBOOK={q(playbook)}",
        f"FC_BUNDLE_CHECK={int(check)}",
        f"FC_BUNDLE_HOSTS={q(listed)}",
        "",
        _WHOLE,
        "fc_bundle_run </dev/null",
        "",
    ]
    header.insert(1, _BEGUN)
    parts = ["\n".join(header), _INTACT, f"PATH=\"$PATH:{PATH}\"",
             *library([book for _, book in books], scope), carried(template("standalone.sh")),
             *functions, "\n".join(body)]
    return "\n".join(parts)


# Under `clush 'bash -s' < BUNDLE` the script comes on standard input, and the login
# shell's startup files run first: one that reads standard input (an ssh without -n, a read,
# a head) takes the bundle's start, and bash -s runs from wherever that left off. The second
# line says the start came; the run at the end goes ahead only where it did (a variable from
# the environment is not the script's). That alone is not enough: a cut lands mid-function
# as often as not, and bash -s then runs the rest of that function's body as commands until
# its stray `}`. ``armored`` makes every tail of the bundle inert (below). pdsh passes the
# bundle in the exec request, and srun runs it as a file: neither can lose its start.
# (fleetclean's own runs start with transport/boot.py.)
_BEGUN = "FC_BUNDLE_BEGUN=1"
_BEGUN_HERE = "[[ ${FC_BUNDLE_BEGUN:-} == 1 && ${FC_BUNDLE_BEGUN@a} != *x* ]]"
_NO_START = f'echo "{CUT_SHORT} (its beginning is missing)" >&2; exit 2'
_WHOLE = f"if ! {_BEGUN_HERE}; then\n    {_NO_START}\nfi"
# 57 bytes make 76 base64 characters and no padding: every '=' in the payload is a line's end.
_CHUNK = 57


def armored(plain: str, *, title: str) -> str:
    """``plain`` (a bundle) for ``bash -s``, safe from any loss of its start: whatever
    a startup file takes, what bash runs of the rest is the whole script or nothing of it.

    The script travels in base64 inside one single-quoted string, each line behind a ``#``
    and before a ``=``. Cut there, bash reads comments, at most one tail of a line (one word
    ending in ``=``: an assignment, or no such command), then the string's closing quote
    opens one that ends on the last line but one, just before ``echo CUT_SHORT; exit 2``.
    Cut in the first line, what is left of it fails (``usr/bin/env``: no such file) or
    starts a shell that reads the rest (``bash``, ``sh``), and the rest is whole: it runs
    (a POSIX-mode bash as ``sh`` included: the decoded script leaves that mode). Cut in the
    second, ``FC_BUNDLE_BEGUN`` is not set: CUT_SHORT, exit 2. Cut in the third line or
    after the string, what is left is the tail of a line that does not parse (an ``if`` or
    ``{`` short of its start; each comment ends in ``;;``, a syntax error outside a
    ``case``), and bash runs no word of a line it cannot parse; or a comment, and then the
    CUT_SHORT of the last line. Whole, the third line (under ``bash -s``: it reads all the
    rest at once) or the last but one (from a file or a ``-c`` string) decodes the string
    (coreutils' ``tr`` and ``base64``), runs it if it has the script's length, and exits.
    Nothing after the string holds a single quote but that one. ``title``: a comment line
    of the bundle's, said again after the string.

    >>> text = armored("echo hi\\n", title="# fleetclean: a test")
    >>> text.splitlines()[3:5]
    ["FC_BUNDLE_B64='", '#ZWNobyBoaQoK=']
    >>> text.split(_STRING, 1)[1].count("'"), text.splitlines()[-4]
    (2, '# fleetclean: a test ;;')
    """
    data = plain.encode()
    data += b"\n" * (-len(data) % 3)  # no '=' of base64's own: lines end in ours
    code = base64.b64encode(data).decode()
    step = _CHUNK * 4 // 3
    string = "\n".join([_STRING, *(f"#{code[i:i + step]}=" for i in range(0, len(code), step))])
    # What $(...) gives back of it: the script less its last newlines.
    decode = _decode_and_run(len(data.rstrip(b"\n")))
    # ASCII only, as all that follows the string (whose every tail the docstring weighs).
    about = [re.sub(r"[^\w .,:\[\]#/+-]", "?", title, flags=re.ASCII) + " ;;",
             "# Above: the bundle in base64, --plain prints it as text ;;"]
    rest = "\n".join([string, "'", *about,
                      f"if {_BEGUN_HERE}; then {decode}; fi; {_NO_START} #'; {_NO_START}",
                      _NO_START, ""])
    return "\n".join(["#!/usr/bin/env bash", _BEGUN,
                      _read_ahead(len(rest.encode()), len(string.encode()), decode), rest])


_STRING = "FC_BUNDLE_B64='"


def _decode_and_run(size: int, decode: str = "", needs: str = "coreutils: tr, base64") -> str:
    """bash that decodes ``FC_BUNDLE_B64`` and runs it where it came out ``size`` bytes
    long, then exits; else it says so and exits 2. ``command -p``: the login shell's PATH
    may lack /usr/bin (a ``tr`` not found left ``base64 -d`` nothing to decode: nothing
    ran, and the exit status was 0); the hash table it would consult in bash 4.4 is still
    empty here. ``set +o posix``: a cut first line can leave ``sh``, which on RHEL is bash
    in POSIX mode, where the script's ``<(...)`` is a syntax error. ``decode``: the
    pipeline that prints the script (default: the armored string's, :func:`armored`);
    ``needs``: what a host that cannot run it lacks, in the message."""
    decode = decode or ('printf %s "$FC_BUNDLE_B64" | command -p tr -d "#=\\n" | '
                        'command -p base64 -d')
    return (f'LC_ALL=C; unset FC_SRC; FC_SRC=$({decode}); '
            f'if ((${{#FC_SRC}} == {size})); then unset FC_BUNDLE_B64; set +o posix; '
            'eval "$FC_SRC"; exit; fi; echo "fleetclean: the bundle arrived damaged or changed '
            f'(or this host lacks {needs}), nothing was run" >&2; exit 2')


def compressed(plain: str) -> str:
    """``plain`` (a bundle) as one short bash command line that runs it: gzip'd and in
    base64, a quarter of its size. pdsh hands a bundle to the nodes as one argument, which
    Linux caps at 128 KiB (MAX_ARG_STRLEN, on pdsh's side and in sshd's ``sh -c`` alike):
    post-extraction's, 137 KB as text, could no longer be passed at all. Decoded by
    coreutils' ``base64`` and ``gzip``, found the way :func:`_decode_and_run` finds them;
    the base64 holds no ``%`` (pdsh's) nor quote.

    >>> line = compressed("echo hi\\n")
    >>> line.startswith("FC_BUNDLE_B64=H4sI"), "'" in line.split(";")[0]
    (True, False)
    """
    data = plain.encode()
    code = base64.b64encode(gzip.compress(data, compresslevel=9, mtime=0)).decode()
    decode = 'command -p base64 -d <<<"$FC_BUNDLE_B64" | command -p gzip -dc'
    # What $(...) gives back of it: the script less its last newlines.
    return (f"FC_BUNDLE_B64={code}; "
            + _decode_and_run(len(data.rstrip(b"\n")), decode, "base64 (coreutils) and gzip"))


def _read_ahead(size: int, string: int, decode: str) -> str:
    """The armored bundle's third line: under ``bash -s`` (no file, no -c string) where the
    start came, read the ``size`` bytes of the rest at once, take the string's ``string``
    first ones and run them, as transport/boot.py does: bash reads a script on a pipe a
    byte a system call (130,000 here), ``read -N`` in blocks (bash 5.1 and later). It
    reads to the end: a bash that a cut first line started (its tail ``bash``) runs the
    bundle and leaves its own bash nothing to read. What is left of this line when cut is a
    syntax error (an ``if`` or ``{`` short of its start) or checks the start came; it holds
    no single quote, which would pair with the string's."""
    skip = len(_STRING) + 1
    return (f"[[ -n ${{BASH_SOURCE[0]:-}}${{BASH_EXECUTION_STRING:-}} ]] || {{ if {_BEGUN_HERE}; "
            f"then LC_ALL=C; read -r -N {size} FC_BUNDLE_B64; if ((${{#FC_BUNDLE_B64}} == {size}"
            f")); then FC_BUNDLE_B64=${{FC_BUNDLE_B64:{skip}:{string - skip}}}; {decode}; fi; "
            f'echo "{CUT_SHORT} (its end is missing)" >&2; exit 2; fi; }}')


# pdsh expands %h, %u, %n and %% in the command it runs; `export script --pdsh` doubles every
# % so that the bundle arrives as written. A bundle that did not (the plain one through
# pdsh, the --pdsh one through clush) would run with its ${x%%...} turned into ${x%...}:
# it stops here instead, before anything runs.
_INTACT = """\
FC_PERCENT='%%'
if ((${#FC_PERCENT} != 2)); then
    echo "fleetclean: this bundle was changed on its way here (pdsh expands %; for pdsh use \\
'fleetclean export script --pdsh', for any other tool the bundle without it)" >&2
    exit 2
fi"""


def bundle_title(playbook: str, names: Sequence[str]) -> str:
    """A bundle's first comment line: what it runs, where.

    >>> bundle_title("post-extraction", ["gpu01", "gpu02"]).split(": ", 1)[1]
    'bundle of playbook post-extraction for 2 hosts: gpu[01-02]'
    """
    return (f"# fleetclean {__version__}: bundle of playbook {playbook} for {len(names)} "
            f"host{'s' if len(names) != 1 else ''}: {fold(names)}")


def _short_names(names: Sequence[str]) -> dict[str, str]:
    """Short name -> host, for ``gpu01`` of ``gpu01.lab`` (a node's hostname is often the
    short one), where no other host has that short name and no host is called that.

    >>> _short_names(["gpu01.lab", "gpu02.lab", "gpu02.dev", "gpu03"])
    {'gpu01': 'gpu01.lab'}
    """
    full = set(names)
    owners: dict[str, list[str]] = {}
    for name in names:
        short = name.split(".", 1)[0]
        if short != name and short not in full:
            owners.setdefault(short, []).append(name)
    return {short: hosts[0] for short, hosts in owners.items() if len(hosts) == 1}
