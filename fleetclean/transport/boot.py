"""The command the host's login shell runs to start a script over SSH: a ``bash -c`` that
reads the whole script from standard input, then runs it, or runs none of it.

sshd runs the command with the account's login shell, and that shell reads its startup
files first: bash started by sshd reads ~/.bashrc (Debian and Ubuntu build it so, and
/etc/bash.bashrc too), zsh ~/.zshenv. Anything in them that reads standard input (an
``ssh`` without ``-n``, a ``read``, a prompt) takes the first bytes of the script, which
travel on standard input from the start. Under ``bash -s`` the rest would then run from
wherever that left off, without its first lines: on a simulated node whose ~/.bashrc read
50,000 of post-extraction's 78,000 bytes, ``fc_main`` ran with half of its functions
undefined. This command comes in the SSH exec request, which no startup file can read: it
reads exactly the script's size (``read -N``, in blocks) and runs it (``eval``) only when
every byte came; else it says so on stderr (``CUT_SHORT``), exits 1 and has run no line
of the script (a status's GPU read, below, which only reads, has started). The script's
own first lines (render.read_whole, for ``bash -s``) stand aside under ``bash -c``, its
early reads (render.early_reads) run first as under ``bash -s``.

The command holds no newline, no ``!`` and no single quote but shlex's own, so that every
login shell takes it alike (sh, bash, zsh, fish, tcsh); nothing of the script is in it, so
no pattern of the script is in any process's argv, with one exception: a status script's
GPU read (render.early_reads: one nvidia-smi query, which only reads) starts in the command
itself, before the script is read (:func:`first_read`). The script's first commands wait
for all of its 44 KB to come and be read (1.2 ms of wall on an H100 node, where the GPU
read is the status's critical path); the command runs even where the script then turns
out cut short, which runs no line of the script, and holds none of the session's
descriptors (the pipe is its output: a cut run ends without waiting for it). Its argv then
holds nvidia-smi's: a teardown whose pattern matches that command line would end the
status's read either way, since nvidia-smi's own argv is the same. The kernel log's read
(render.early_reads) still starts once all of the script has come.

>>> command(1234)  # doctest: +ELLIPSIS
'bash --norc -p -c \\'set +o posix; eval "$1"\\' bash \\'set +p; unset TMOUT BASH_COMPAT; ...'
>>> "\\n" in command(1234) or "!" in command(1234)
False
"""

from __future__ import annotations

import shlex

# The bash that runs a script, as the login shell's command or sudo's starts it, clean of
# what the login's startup files make of every bash (bash 4.4 and 5.x alike):
# - -p (privileged mode; with the real and the effective ids equal, as here, nothing else
#   of it applies): bash ignores BASH_ENV, which a non-interactive bash sources first (HPC
#   nodes set it for Lmod's `module`), functions exported with `export -f` (one named
#   nvidia-smi or kill would stand in for the command), SHELLOPTS and BASHOPTS (errexit,
#   nounset or nocasematch would change what the script does), CDPATH and GLOBIGNORE.
# - --norc: a `bash -c` started by sshd's login shell, whose exec leaves it at shell level
#   1, reads /etc/bash.bashrc and ~/.bashrc itself where its standard input is a socket
#   (any bash) or SSH_CLIENT is set (Debian's): the login's startup files ran a second
#   time, inside the script's own bash. (A `bash -s` never does; there it changes nothing.)
BASH = "bash --norc -p"

# The script's bash first sets aside what -p cannot: the variables a bash takes from the
# environment whatever its flags that would change the script (an exported TMOUT=1 makes
# every `read` give up after a second; BASH_COMPAT=31 changes `[[ =~ "$re" ]]`), and -p
# itself, which bash writes into an exported SHELLOPTS for every bash below the script (a
# shell stage's command would not source BASH_ENV as the login's bashes do). What the
# script starts gets the login's environment as it is, but for those two variables.
SETTLE = "set +p; unset TMOUT BASH_COMPAT"

# POSIX mode, which bash turns on at its start where POSIXLY_CORRECT is in the environment
# (a login may export it; no flag of bash's undoes it), goes first, before bash parses any
# of the script: bash 4.4 (RHEL 8) in POSIX mode takes a process substitution for a syntax
# error, and the script (and a status's first read) opens with some; bash 5 would run the
# whole script by POSIX mode's rules, which differ from those it was written for. bash
# parses a line whole before it runs any of it, so where this cannot be a line of its own
# (the command, :func:`command`), what follows it is parsed later, by an ``eval``. bash
# unsets POSIXLY_CORRECT as it leaves POSIX mode (and setting it would turn the mode back
# on), so what the script starts does not find it either.
POSIX_OFF = "set +o posix"

# What the command says when fewer bytes came; results/parse.py explains it to a person
# (the argv stays short: a word of it could match another run's pattern).
CUT_SHORT = "fleetclean: the script arrived cut short, nothing was run"


def explained(line: str) -> str:
    """A line of a host's stderr, with what to look at where it is ``CUT_SHORT``'s (said
    over SSH, or by an exported bundle under ``clush 'bash -s'``: engine/export.py).

    >>> explained("bash: fc_x: command not found")
    'bash: fc_x: command not found'
    >>> explained(CUT_SHORT + " (3 of 9 bytes)")[len(CUT_SHORT):][:48]
    " (3 of 9 bytes): something read the script's sta"
    """
    if not line.startswith(CUT_SHORT):
        return line
    if line.startswith(f"{CUT_SHORT} (its end is missing)"):
        return line + ": it stopped coming before its end (a connection that dropped?)"
    # The bytes were taken on the host: the text itself came back from there.
    return (line + ": something read the script's start before bash did, most likely a "
            "startup file of the login shell (~/.bashrc, /etc/bash.bashrc) that reads "
            "standard input; have it return at once when not interactive "
            "([[ $- == *i* ]] || return)")


def command(size: int, first: str = "") -> str:
    """The login shell's command for a script of ``size`` bytes (UTF-8) on standard input,
    starting ``first`` (:func:`first_read`) before it reads the script."""
    return _in_bash(inner(size, first))


def _in_bash(text: str) -> str:
    """The login shell's command that has :data:`BASH` run ``text``."""
    # The command's bash parses only its -c string before it leaves POSIX mode (POSIX_OFF);
    # the rest is its $1 (its $0 stays "bash", as before), which the eval parses after.
    return f"{BASH} -c " + shlex.quote(f'{POSIX_OFF}; eval "$1"') + " bash " + shlex.quote(text)


def given(script: str) -> str:
    """The login shell's command that runs ``script`` given whole in it (pdsh hands an
    exported bundle to the login shell so: ``export script --pdsh``), in the same bash as
    :func:`command`'s: out of POSIX mode before it parses the script, clean of what the
    login's startup files exported. Run as the login shell's own command, the script was at
    the mercy of both, and of the login shell being bash. Unlike :func:`command`'s, this
    one holds the script's newlines and backslashes, which only a POSIX-like login shell
    (sh, bash, zsh) passes on as they are: tcsh refuses a newline inside quotes, and fish
    makes two backslashes one.

    >>> import subprocess
    >>> run = given("echo \\"it's $0, $-\\"")
    >>> subprocess.run(["sh", "-c", run], capture_output=True, text=True).stdout
    "it's bash, hBc\\n"
    """
    return _in_bash(f"{SETTLE}; {script}")


def inner(size: int, first: str = "") -> str:
    """What the command's bash runs (:func:`command`).

    >>> inner(9, "exec {FC_VGFD}< <(nvidia-smi)")  # doctest: +ELLIPSIS
    'exec {FC_VGFD}< <(nvidia-smi); set +p; unset TMOUT BASH_COMPAT; LC_ALL=C; unset FC_SRC; ...'
    """
    return f"{first}; {read_and_run(size)}" if first else read_and_run(size)


# True where the descriptor variable is set and not from the environment: an early read
# started already (by the command: first_read); an exported one is a stranger's, never
# read or closed (render.early_reads opens each early read's line with it).
OWN = "[[ -n ${{{0}:-}} && ${{{0}@a}} != *x* ]]"
# The descriptors of the GPU reads a status script may start first (render.early_reads),
# and the test of a line that starts one or the other, as the node's count of CUDA
# processes says.
FIRST_READS = ("FC_VGFD", "FC_VQFD")
EITHER_READ = f"{OWN.format('FC_VQFD')} || {OWN.format('FC_VGFD')}"


def first_read(head: str) -> str:
    """The command that starts the GPU read of the script that ``head`` begins (its first
    piece, or all of it), or "" where it has none: a status script's fourth line (after
    the shebang, shellcheck's directive and ``POSIX_OFF``: render.early_reads) is ``OWN ||
    { START; }`` (or ``EITHER_READ || { START; }``, START picking the read), and START, in
    the login shell's command, runs before the script is read. The bash that then runs
    the script finds the descriptor its own (``OWN``, ``EITHER_READ``) and leaves the line
    be. Only a START that every login shell passes alike is taken: no newline,
    ``!`` or single quote, and no two backslashes in a row (inside single quotes fish makes
    them one).

    >>> line = OWN.format("FC_VGFD") + " || { unset FC_VGFD; exec {FC_VGFD}< <(nvidia-smi); }"
    >>> first_read("#!/usr/bin/env bash\\n# shellcheck x\\nset +o posix\\n" + line + "\\nrest")
    'unset FC_VGFD; exec {FC_VGFD}< <(nvidia-smi)'
    >>> first_read("#!/usr/bin/env bash\\n# shellcheck x\\nset +o posix\\necho hi\\n")
    ''
    """
    line = (head.split("\n", 4)[3:4] or [""])[0]
    for own in (EITHER_READ, *map(OWN.format, FIRST_READS)):
        opening = own + " || { "
        if line.startswith(opening) and line.endswith("; }"):
            start = line[len(opening):-len("; }")]
            if not set(start) & set("\n!'") and "\\\\" not in start:
                return start
    return ""


def read_and_run(size: int) -> str:
    """bash that reads the next ``size`` bytes of standard input (in the C locale: bytes)
    in one ``read -N`` and runs them, or runs nothing and fails, saying ``CUT_SHORT``, when
    fewer came: this command's whole text, and the line that reads the rest of a script
    under ``bash -s`` (render.read_whole).

    >>> read_and_run(9)  # doctest: +ELLIPSIS
    'set +p; unset TMOUT BASH_COMPAT; LC_ALL=C; unset FC_SRC; read -r -N 9 FC_SRC; if ...'
    """
    return (f"{SETTLE}; LC_ALL=C; unset FC_SRC; read -r -N {size} FC_SRC; "
            f"if ((${{#FC_SRC}} == {size})); "
            f'then eval "$FC_SRC"; else echo "{CUT_SHORT} (${{#FC_SRC}} of {size} bytes)" '
            ">&2; false; fi")
