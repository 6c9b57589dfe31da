"""A :class:`ResolvedPlaybook` -> one bash script for one host. Pure: reads only
package templates, resolves nothing (``fleetclean.engine.variables.resolve`` did).

The script is the stage library (``stages/lib.sh``; ``lib-stage.sh`` too where there is a
stage), the further libraries the playbook's
stage types call into (``lib-kill.sh``, owner attribution ``owner.sh`` and acting through
the owner ``owner-act.sh`` for those that signal; ``owner.sh`` for the verification too,
which names the owner of each GPU holder), the templates of the stage types the playbook
uses, and an ``fc_main`` function that assigns each stage's options as shell-quoted
variables and calls the stage. Nothing runs until the script's last line,
``fc_main </dev/null`` (a script without stages ends with the definitions it parses only
when called after it: :mod:`.lazy`): a connection cut while the script travels runs
nothing, and no command inside can read the rest of the script from standard input.
Under ``bash -s`` the first command reads all that follows it in one go
(:func:`read_whole`).

>>> from fleetclean.engine.playbook import load_playbook
>>> from fleetclean.engine.variables import resolve
>>> pb = load_playbook("post-extraction")
>>> script = render_script(resolve(pb, {}, {"dump_dir": "/tmp/x; rm -rf ~"}))
>>> "opt_paths=('/tmp/x; rm -rf ~')" in script
True
>>> script.splitlines()[-1]
'fc_main </dev/null'
"""

from __future__ import annotations

import json
from typing import Any

from fleetclean import __version__
from fleetclean.engine import lazy
from fleetclean.engine.model import ResolvedPlaybook, Scope
from fleetclean.engine.stages import stage_type, template
from fleetclean.engine.stages.base import q
from fleetclean.engine.stages.verify import (
    KERNEL_LOG_LEVELS,
    KERNEL_LOG_SED,
    VERIFY,
    VERIFY_GPU_ARGS,
    VERIFY_Q_ARGS,
)
from fleetclean.transport.boot import EITHER_READ, OWN, POSIX_OFF, SETTLE, read_and_run

# Non-interactive SSH shells often lack the sbin directories; ours come after the caller's.
_PATH_TAIL = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Every script's header says where the comments ``carried`` leaves out are.
CARRIED_NOTE = "# The packaged bash comes without its comments: fleetclean/engine/stages has them."
# What the header of a host given the cheaper early GPU read says (early_reads).
LAST_CLEAN_NOTE = ("# GPU read: --query-gpu where /sys/module/nvidia_uvm/refcnt is 0 or cannot be "
                   "read, else -q (every GPU read clean at the host's last status)")
# And where its last status named processes: what `fleetclean show` tells a person.
NAMED_NOTE = ("# GPU read: -q, and while it runs the processes the host's last status named "
              "(FC_VHINT: PID:START)")
# Open files of /dev/nvidia-uvm, as the kernel counts them (early_reads), and the modules'
# directories, which say whether a missing count is a module not loaded.
UVM_MODULE = "/sys/module/nvidia_uvm"
UVM_REFCNT = f"{UVM_MODULE}/refcnt"
NVIDIA_MODULE = "/sys/module/nvidia"
# True where the script runs as a file or a -c string, not read by ``bash -s``.
_UNDER_BASH_S = "[[ -n ${BASH_SOURCE[0]:-}${BASH_EXECUTION_STRING:-} ]]"


def _comment_value(value: Any) -> str:
    # JSON keeps newlines and quotes of hostile values on one comment line.
    return json.dumps(value, default=str, ensure_ascii=False)


def render_script(resolved: ResolvedPlaybook, *, check: bool = False, force: bool = False,
                  host_name: str = "", scope: Scope | None = None,
                  last_clean: bool = False) -> str:
    """Render the bash script for one host; a read-only playbook (``status``) always
    renders in check mode, and ``force`` set in the variables counts as ``--force``."""
    return "".join(Renderer(scope).pieces(resolved, check=check, force=force,
                                          host_name=host_name, last_clean=last_clean))


class Renderer:
    """Renders many hosts' scripts as pieces whose concatenation is ``render_script``'s
    text: the stage library, nearly all of a script (75 KB of post-extraction's 78 KB,
    32 KB of status's 34 KB, as ``carried``), is read, cut and joined once per set of stage
    types and is then the same string object in every host's pieces; only the header and
    ``fc_main`` (a few KB, the host's name and variables in them) are each host's own. A
    copy of the whole text per host, kept from rendering until the run ends, was 110 MB of
    the controller's peak RSS at 1,000 hosts (issue #18), when scripts still carried their
    comments.

    >>> from fleetclean.engine.playbook import load_playbook
    >>> from fleetclean.engine.variables import resolve
    >>> book = resolve(load_playbook("status"), {}, {})
    >>> renderer = Renderer()
    >>> a = renderer.pieces(book, host_name="gpu01")
    >>> b = renderer.pieces(book, host_name="gpu02")
    >>> a[1] is b[1], "".join(a) == render_script(book, host_name="gpu01"), a == b
    (True, True, False)
    """

    def __init__(self, scope: Scope | None = None) -> None:
        self._scope = scope
        self._libraries: dict[tuple[object, ...], tuple[str, str, int]] = {}

    def pieces(self, resolved: ResolvedPlaybook, *, check: bool = False, force: bool = False,
               host_name: str = "", last_clean: bool = False, run: str = "",
               unheard: str = "", named: str = "") -> tuple[str, ...]:
        """(head, library, tail) of one host's script, and for a script without stages the
        definitions it parses only when called (:mod:`.lazy`); the libraries are shared.
        ``last_clean``: every GPU of the host read clean at its last status
        (:mod:`fleetclean.results.lastclean`), so that bash parses the -q read's
        definitions only where the node's count makes that its early GPU read, and the
        read is the query where the count cannot be read (:func:`early_reads`,
        :func:`.lazy.tiers`). ``run``, ``unheard`` and ``named``:
        :func:`main_function`'s (``named`` only for a status: its early read is -q)."""
        check = check or resolved.read_only
        force = force or resolved.force
        shebang, _, header = _header(resolved, check, force, host_name).partition("\n")
        lib, rest, shared_size = self._library(resolved, last_clean, bool(named))
        main = "\n".join([*main_function(resolved, check=check, force=force,
                                         host=q(host_name), scope=self._scope, run=run,
                                         unheard=unheard, named=named),
                          "", "fc_main </dev/null", ""])
        header += "\n"
        early = ""
        if resolved.verify is not None and not resolved.stages:
            early = "\n".join(early_reads(q_only=bool(named), last_clean=last_clean)) + "\n"
            if named:
                header += NAMED_NOTE + "\n"
            elif last_clean:
                header += LAST_CLEAN_NOTE + "\n"
        # What follows fc_main's call is never parsed unless fc_lazy asks for it.
        tail = "\n" + main + ("exit\n" if rest else "")
        size = len(header.encode()) + shared_size + len(tail.encode())
        # The directive lib.sh opens with is file-wide only before the first command. The
        # waiting definitions come after an exit, reached through fc_lazy's eval, which
        # shellcheck cannot follow (it calls them unreachable and never invoked).
        codes = "SC2034,SC2317,SC2329" if rest else "SC2034"
        # POSIX mode goes before the first line with a process substitution is parsed (a
        # line of its own: bash parses a line whole before it runs any of it).
        head = (f"{shebang}\n# shellcheck disable={codes}\n{POSIX_OFF}\n{early}"
                f"{read_whole(size)}\n{header}")
        return (head, lib, tail, rest) if rest else (head, lib, tail)

    def _library(self, resolved: ResolvedPlaybook, last_clean: bool = False,
                 named: bool = False) -> tuple[str, str, int]:
        """``library`` joined (cut in two by :func:`.lazy.split` where there is no stage,
        by the tiers of what the host's last status saw: ``last_clean``, ``named``), and the
        two's size in bytes: once per set of stage types."""
        scope = self._scope
        status = not resolved.stages and resolved.verify is not None
        last_clean, named = last_clean and status, named and status
        # owner_slurm decides whether owner-slurm.sh is carried (library): a host whose
        # group makes it stop must not get another host's library without it.
        key = (tuple(s.type for s in resolved.stages), resolved.verify is not None,
               scope is not None and scope.active, last_clean, named,
               resolved.owner_actions.get("slurm") == "stop")
        known = self._libraries.get(key)
        if known is None:
            text, rest = "\n".join(library([resolved], scope)), ""
            if not resolved.stages:
                text, groups = lazy.split(text, lazy.tiers(last_clean, named))
                text += lazy.loader(groups)
                rest = lazy.end(groups)
            known = self._libraries[key] = (text, rest,
                                            len(text.encode()) + len(rest.encode()))
        return known


# The notes of nvidia-smi calls an earlier run left in a hung driver (lib.sh: FC_SMI_NOTES,
# the same three): root's, then another login's where its lock directory may be.
SMI_NOTES = ("/run/fleetclean-smi-stuck", "/tmp/fleetclean-lock-$EUID/smi-stuck",
             "${XDG_RUNTIME_DIR:-/-}/fleetclean-lock/smi-stuck")


def noted_test() -> str:
    """bash's test for a note (lib.sh: fc_begin tests the same): root's, or, for another
    login, one of its own in a directory of its own (only root's counts for root: another
    user could plant one in /tmp; nor is one another user planted for this login, or a
    symlink it planted to what is this login's, /proc/self)."""
    root, mine, xdg = SMI_NOTES
    mine_dir, xdg_dir = mine.rsplit("/", 1)[0], xdg.rsplit("/", 1)[0]
    return (f"-e {root} || $EUID -gt 0 && (-O {mine_dir} && -O {mine} || "
            f"-O {xdg_dir} && -O {xdg})")


def early_reads(q_only: bool = False, last_clean: bool = False) -> tuple[str, str]:
    """What a script whose first work is the verification's read (``status``: no stage)
    starts before bash reads and parses the rest of it: the GPU read and the kernel log,
    each a process whose output waits in a pipe (``FC_VGFD`` or ``FC_VQFD``, and
    ``FC_VXIDFD``) for the verification, which reads them instead of starting its own.
    nvidia-smi's wall time (20-25 ms on an H200, more with eight GPUs) then overlaps bash's
    own start-up and the first lines of the script rather than following them (over SSH the
    login shell's command starts the GPU read before it reads the script,
    ``transport.boot.first_read``, and the kernel log's once the whole script has come);
    and each is forked by a bash that holds no definitions yet, which is cheaper. Both only
    read; PATH gets the same tail as ``fc_main`` gives it, and neither can read the script
    on standard input; the GPU read holds no descriptor of the session but its pipe.

    Each is a line of its own, before the one that reads the rest (:func:`read_whole`):
    under ``bash -s``, bash reads a script from a pipe one byte per read(2) and runs
    nothing before the line's end, so nvidia-smi starts without waiting for the bytes
    after it (0.2 ms on an H200 node's CPU). Each runs once however the script is started:
    under ``bash -s`` bash runs them before the rest is read; started by the command of
    ``transport.boot`` (the whole script read, then run by ``eval``) they are its first
    commands, but for the GPU read, which that command started (its descriptor set, as a
    test that has started its own read first keeps it).

    Which GPU read, the node says (``FC_UVM``): the kernel counts a reference on the
    nvidia_uvm module for each open file of /dev/nvidia-uvm, which every CUDA process opens
    and no NVML reader does (nvidia-smi, nvidia-persistenced): one read(2) of
    ``/sys/module/nvidia_uvm/refcnt``. At 0 no CUDA process can hold a GPU context (a
    graphics one, Xorg's, opens no /dev/nvidia-uvm: its memory is found as below): the read
    is ``--query-gpu`` (``FC_VGFD``), the query pdsh users type, and the compute apps are
    asked for only where some GPU is in use all the same (a leak no process holds;
    verify.sh: fc_verify_read_gpus). Above 0 it is ``-q`` (``FC_VQFD``), the GPUs and their
    processes in one call, as for a host whose last status named processes (``q_only``:
    those are read while it runs, verify.sh: fc_verify_prep). Where the count cannot be
    read, the controller's hint picks, as before the count: the query for a host whose
    GPUs all read clean at its last status (``last_clean``), -q for any other. A missing
    file does not mean that no CUDA process runs: a node whose sysfs does not show its
    modules (seen on a sandboxed H100 running a 40 GiB CUDA server: no
    /sys/module/nvidia*) took 3.0x the bare query's wall with the query and the apps one
    after the other, against 1.9x with -q. Where the driver's module shows and nvidia_uvm's
    does not, that module is not loaded (no CUDA process has run since boot): a count of
    0. The count only picks the read, never a row: a
    wrong guess costs a second query (a CUDA process started just after the read of the
    count) or -q's 1-3 ms more (one holding no context), and the verification reads what
    is there either way.

    The -q read leaves the row remapper's section out: the verification reads it beside
    this one where the kernel log cannot rule a pending remap out (fc_verify_gate). Of
    the kernel log, dmesg prints only the levels that hold what the verification reads
    (``KERNEL_LOG_LEVELS``), where the kernel's default level is one of them and dmesg
    can filter; else sed passes on only that (``KERNEL_LOG_SED``), where the node has sed
    (verify.sh: fc_verify_klog).

    >>> gpu, klog = early_reads()
    >>> "{FC_VQFD}< <(" in gpu, "{FC_VGFD}< <(" in gpu, UVM_REFCNT in gpu, "dmesg -l " in klog
    (True, True, True, True)
    >>> gpu = early_reads(q_only=True)[0]
    >>> "nvidia-smi -q -d MEMORY,PIDS 2>&1)" in gpu, "FC_VGFD" in gpu
    (True, False)
    """
    path = f"PATH=$PATH:{_PATH_TAIL}"
    # Over SSH the login shell's command starts this line's braces' content itself, before
    # it reads the script (transport.boot.first_read): no single quote in it.
    # Its exec, not a redirection of a group, which would keep the session's stderr open
    # (saved) in the subshell till nvidia-smi ends: a run cut short ends without it.
    # The output whole at its end, not as nvidia-smi flushes it (4 KB at a time into a
    # pipe, a GPU's sections at a time: 9-12 KB of -q for eight GPUs): the processes read
    # while the -q read runs (verify.sh: fc_verify_prep, which stops at its first byte) are
    # read until it is done, and its first byte is all the reader waits for with a
    # deadline (lib.sh: fc_smi_read): a call that stops answering part way sends nothing.

    def start(fd: str, args: str) -> str:
        return (f"exec {{{fd}}}< <(exec 2>/dev/null </dev/null; o=$({path} nvidia-smi {args} "
                '2>&1); printf "%s\\n@%d" "$o" "$?")')

    q = start("FC_VQFD", VERIFY_Q_ARGS)
    if q_only:
        own, fds, pick = OWN.format("FC_VQFD"), "FC_VQFD FC_UVM", q
    else:
        own, fds = EITHER_READ, "FC_VQFD FC_VGFD FC_UVM"
        # The count as the kernel writes it ("0\n", "3\n"); nothing where it cannot be read;
        # 0 where the driver's module shows and nvidia_uvm's does not (not loaded yet). No
        # "!": boot.first_read takes no START with one (csh's history).
        unread = "" if last_clean else " || -z $FC_UVM"
        pick = (f"read -r FC_UVM 2>/dev/null <{UVM_REFCNT}; if [[ -n $FC_UVM || -e {UVM_MODULE} "
                f"]]; then :; elif [[ -d {NVIDIA_MODULE} ]]; then FC_UVM=0; fi; "
                f"if [[ $FC_UVM == [1-9]*{unread} ]]; then {q}; "
                f"else {start('FC_VGFD', VERIFY_GPU_ARGS)}; fi")
    # None where a note says an earlier run's nvidia-smi waits in a hung driver (lib.sh:
    # fc_smi_noted, which the verification's own read then asks first). FC_UVM unset first
    # whatever the read: one from the environment would stay exported to every child.
    gpu = (f"{own} || {{ unset {fds}; LC_ALL=C; [[ {noted_test()} ]] || {{ {pick}; }}; }}")
    klog = (f"{OWN.format('FC_VXIDFD')} || {{ unset FC_VXIDFD; LC_ALL=C; "
            f"exec {{FC_VXIDFD}}< <({path}; "
            "read -r _ l _ 2>/dev/null </proc/sys/kernel/printk; "
            f"if [[ $l == [0-5] ]] && dmesg -l {KERNEL_LOG_LEVELS} 2>/dev/null </dev/null; "
            "then :; elif command -v sed >/dev/null 2>&1; then "
            f"dmesg 2>/dev/null </dev/null | sed -n '{KERNEL_LOG_SED}'; "
            "else dmesg 2>/dev/null </dev/null; fi); }")
    return gpu, klog


def read_whole(size: int) -> str:
    """The script's first command after ``POSIX_OFF`` (its fourth line; its sixth after
    the early reads of :func:`early_reads`): under ``bash -s`` (no file, no ``-c``
    string), read the ``size`` bytes after this line in one builtin ``read -N`` and run
    them (``eval``), or run nothing when fewer arrived (``transport.boot.read_and_run``,
    which over SSH is the whole command). bash reads a script from a pipe one byte per
    read(2), so that a command it runs can read the rest: a system call per byte (34,000
    for status), most of the CPU a status script cost on the node; ``read -N`` reads in
    blocks (bash 5.1 and later). A file run with ``bash FILE`` or a ``bash -c`` string
    (``transport.boot``, which reads the whole script itself) is read on as usual.

    >>> read_whole(12)[:48]
    '[[ -n ${BASH_SOURCE[0]:-}${BASH_EXECUTION_STRING'
    """
    return f"{_UNDER_BASH_S} || {{ {read_and_run(size)}; exit; }}"


def library(books: list[ResolvedPlaybook], scope: Scope | None = None) -> list[str]:
    """The bash every script of these playbooks needs: ``lib.sh`` (and ``lib-stage.sh``,
    the stage driver and the whole process table, where there is a stage: a status script
    carries only what its verification runs: less for bash to parse), the scope's
    functions when there is a scope (or a stage that finds a Slurm job's processes), the libraries
    their stage types call into (once each), then the template of each stage type they use
    (once each, in order of first use), then the verification's (among the libraries
    instead where a stage type calls into it)."""
    used = dict.fromkeys(s.type for book in books for s in book.stages)
    parts = [template("lib.sh")]
    if used:
        parts.append(template("lib-stage.sh"))
    if (scope is not None and scope.active) or "slurm-job" in used:
        parts.append(template("scope.sh"))
    libraries = libraries_of(books)
    parts += [template(lib) for lib in libraries]
    # Slurm's own client, only where a playbook stops jobs through it (an epilog never).
    if "owner-act.sh" in libraries and any(
            book.owner_actions.get("slurm") == "stop" for book in books):
        parts.append(template("owner-slurm.sh"))
    parts += [stage_type(t).template.read_text(encoding="utf-8") for t in used]
    # Carried once, among the libraries where a stage type calls into it (gpu-holders).
    if any(book.verify is not None for book in books) and VERIFY.template.name not in libraries:
        parts.append(VERIFY.template.read_text(encoding="utf-8"))
    return [carried(part) for part in parts]


def carried(text: str) -> str:
    """A packaged bash file as a script carries it: without its blank lines and the lines
    that are only a comment, but for shellcheck's directives (the golden scripts are
    checked). bash takes in a script one character at a time, comments too: on a status
    script, 57 KB of which 25 KB were comments, that was a tenth of the script's own CPU
    on the node (1.1 ms of 11 ms here, with nvidia-smi's answer stubbed out). The comments
    stay in the packaged files, which are the source; the templates have no here-document
    or multi-line string for this to cut into (tests/engine/test_carried.py: what bash
    defines from a file is the same either way).

    A line after one that ends in a backslash is kept whatever it is: the two are one line
    to bash, and cutting the second would join the first to the next.

    >>> carried("f() {\\n    # why\\n\\n    true  # kept\\n}\\n# shellcheck disable=SC2034\\n")
    'f() {\\n    true  # kept\\n}\\n# shellcheck disable=SC2034\\n'
    >>> carried("a \\\\\\n\\nb\\n")
    'a \\\\\\n\\nb\\n'
    """
    kept: list[str] = []
    for line in text.splitlines(keepends=True):
        bare = line.strip()
        joined = bool(kept) and kept[-1].rstrip("\n").endswith("\\")
        if joined or (bare and (not bare.startswith("#") or bare.startswith("# shellcheck"))):
            kept.append(line)
    return "".join(kept)


def libraries_of(books: list[ResolvedPlaybook]) -> list[str]:
    """The packaged libraries the stage types and the verification of these playbooks call
    into, once each, in order of first use."""
    used = dict.fromkeys(s.type for book in books for s in book.stages)
    libraries = dict.fromkeys(lib for t in used for lib in stage_type(t).libraries)
    if any(book.verify is not None for book in books) or VERIFY.template.name in libraries:
        libraries.update(dict.fromkeys(VERIFY.libraries))
    return list(libraries)


def _header(resolved: ResolvedPlaybook, check: bool, force: bool, host_name: str) -> str:
    where = "built-in" if resolved.builtin else resolved.path
    variables = resolved.variables
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# fleetclean {__version__}: playbook {resolved.name} ({where})",
        f"# host: {_comment_value(host_name)}  mode: {'check' if check else 'run'}"
        f"{'  force' if force else ''}",
        "# Runs as `bash -s` with this text on standard input (over SSH, fleetclean's own",
        "# `bash -c` reads it whole first: transport/boot.py). Records go to stdout as",
        "# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.",
        CARRIED_NOTE,
        "# variables:",
        *variable_comments(variables),
        "",
    ])


def _owner_lines(resolved: ResolvedPlaybook) -> list[str]:
    acts = " ".join(f"[{kind}]={q(act)}" for kind, act in resolved.owner_actions.items())
    return [f"    FC_OWNER_ACT=({acts})",
            f"    FC_NEVER_STOP=({' '.join(q(u) for u in resolved.never_stop_units)})"]


def variable_comments(variables: dict[str, Any]) -> list[str]:
    """``#   name = value`` lines, one a variable, values as JSON (one line each)."""
    return [f"#   {k} = {_comment_value(variables[k])}" for k in sorted(variables)]


def main_function(resolved: ResolvedPlaybook, *, check: bool, force: bool, host: str,
                  name: str = "fc_main", scope: Scope | None = None, run: str = "",
                  unheard: str = "", named: str = "") -> list[str]:
    """The lines of the function that runs the stages and the verification; ``host`` is
    the shell word ``FC_HOST`` gets (a quoted name, or a variable set at run time).
    ``run``: a teardown's token, which its journal carries (none for a read-only run:
    ``commands.steps.render_jobs`` decides); ``unheard``: the tokens
    (space-separated) of this host's teardowns whose end the controller did not hear, whose
    journals the script sends (lib.sh: the journal; :mod:`fleetclean.results.unheard`);
    ``named``: the processes the host's last status named ("PID:START ...": each one's PID
    and start time), which a status reads while its early -q read runs (verify.sh: fc_verify_prep;
    :mod:`fleetclean.results.lastclean`)."""
    main = [
        f"{name}() {{",
        f"    {SETTLE}",
        "    export LC_ALL=C",
        f'    PATH="$PATH:{_PATH_TAIL}"',
        f"    FC_PLAYBOOK={q(resolved.name)}",
        f"    FC_HOST={host}",
        f"    FC_CHECK={int(check)}",
        f"    FC_FORCE={int(force)}",
        f"    FC_LOCK_WAIT={resolved.lock_wait:g}",
        # Fixed decimals: read -t takes no exponent (1e-05).
        f"    FC_SMI_TIMEOUT={max(resolved.smi_timeout, 0.001):.3f}",
        f"    FC_PROTECT=({' '.join(q(n) for n in resolved.protect)})",
        *([f"    FC_RUN={q(run)}"] if run else []),
        *([f"    FC_UNHEARD={q(unheard)}"] if unheard else []),
        *([f"    FC_VHINT={q(named)}"] if named else []),
        *(_owner_lines(resolved) if "owner-act.sh" in libraries_of([resolved]) else []),
        "    if ! fc_begin; then",
        '        fc_rec error "host busy: another fleetclean run holds $FC_LOCK_PATH"',
        "        fc_finish",
        "        return 0",
        "    fi",
    ]
    if scope is not None and scope.active:
        gpu_ids = "slurm" if scope.slurm_job else "" if scope.gpus is None else "list"
        main += ["", f"    # scope: {scope.describe()}",
                 f"    FC_SCOPE_USER={q(scope.user or '')}",
                 f"    FC_SCOPE_JOB={'${SLURM_JOB_ID:-}' if scope.slurm_job else q('')}",
                 f"    FC_SCOPE_GPU_IDS={gpu_ids}",
                 f"    FC_SCOPE_GPUS=({' '.join(map(str, scope.gpus or ()))})",
                 "    fc_scope_begin"]
    total = len(resolved.stages)
    for i, stage in enumerate(resolved.stages, start=1):
        main += ["", f"    # stage {i}/{total}: {_comment_value(stage.name)} ({stage.type})",
                 "    fc_reset_opts"]
        main += [f"    {line}" for line in stage_type(stage.type).assignments(stage)]
        main.append(f"    fc_stage {i} {q(stage.name)} {q(stage.type)}")
    if resolved.verify is not None:
        main += ["", "    # verify: every GPU at or under max_used_mib before the deadline",
                 "    fc_reset_opts"]
        main += [f"    {line}" for line in VERIFY.assignments(resolved.verify)]
        main.append("    fc_verify")
    main += ["    fc_finish", "}"]
    return main
