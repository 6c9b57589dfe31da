"""(playbook, variables) -> one bash script for one host. Pure: reads only package templates.

The script is the stage library (``stages/lib.sh``), the templates of the stage types the
playbook uses, and an ``fc_main`` function that assigns each stage's options as
shell-quoted variables and calls the stage. Nothing runs until the script's last line,
``fc_main </dev/null``: a connection cut while the script travels runs nothing, and no
command inside can read the rest of the script from standard input.

>>> from fleetclean.playbook import load_playbook
>>> from fleetclean.variables import resolve_vars
>>> pb = load_playbook("post-extraction")
>>> script = render_script(pb, resolve_vars(pb, {}, {"grace": "'; touch /tmp/pwned #"}))
Traceback (most recent call last):
fleetclean.errors.VariableError: ...grace must be a non-negative number of seconds...
>>> script = render_script(pb, resolve_vars(pb, {}, {"dump_dir": "/tmp/x; rm -rf ~"}))
>>> "opt_paths=('/tmp/x; rm -rf ~')" in script
True
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from importlib import resources
from typing import Any

from fleetclean import __version__
from fleetclean.playbook import Playbook
from fleetclean.variables import ResolvedStage, resolve_playbook

STAGE_TEMPLATES = {
    "signal": "signal.sh",
    "gpu-holders": "gpu-holders.sh",
    "restore": "restore.sh",
    "remove": "remove.sh",
    "guard": "guard.sh",
    "shell": "shell.sh",
}

# Non-interactive SSH shells often lack the sbin directories; ours come after the caller's.
_PATH_TAIL = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def template(name: str) -> str:
    """The text of one packaged bash template, e.g. ``template("lib.sh")``."""
    return (resources.files("fleetclean") / "stages" / name).read_text(encoding="utf-8")


def q(value: str) -> str:
    """Shell-quote for bash: every substituted value goes through here."""
    return shlex.quote(value)


def _seconds_ms(seconds: float) -> str:
    return str(round(seconds * 1000))


def _stage_assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    if stage.type in ("signal", "gpu-holders"):
        lines = [
            f"opt_signal={q(o['signal'])}",
            f"opt_grace_ms={_seconds_ms(o['grace'])}",
            f"opt_kill_wait_ms={_seconds_ms(o['kill_wait'])}",
            f"opt_tree={int(o['tree'])}",
        ]
        if stage.type == "signal":
            return [f"opt_pattern={q(o['pattern'])}", *lines]
        return [f"opt_filter={q(o['filter'])}", *lines]
    if stage.type == "restore":
        return [f"opt_file={q(o['file'])}", f"opt_backup_suffix={q(o['backup_suffix'])}"]
    if stage.type == "remove":
        paths = " ".join(q(p) for p in o["paths"])
        globs = " ".join(str(int(g)) for g in o["globs"])
        return [f"opt_paths=({paths})", f"opt_globs=({globs})",
                f"opt_missing_ok={int(o['missing_ok'])}"]
    if stage.type == "guard":
        return [
            f"opt_path={q(o['path'])}",
            f"opt_wait_for_file={q(o['wait_for_file'])}",
            f"opt_wait_for_line={q(o['wait_for_line'])}",
            f"opt_timeout_ms={_seconds_ms(o['timeout'])}",
        ]
    if stage.type == "shell":
        env = " ".join(f"{q(k)} {q(v)}" for k, v in sorted(stage.env.items()))
        return [
            f"opt_command={q(o['command'])}",
            f"opt_env=({env})",
            f"opt_timeout_s={o['timeout']:g}",
        ]
    raise AssertionError(f"no renderer for stage type {stage.type}")


def _comment_value(value: Any) -> str:
    # JSON keeps newlines and quotes of hostile values on one comment line.
    return json.dumps(value, default=str, ensure_ascii=False)


def render_script(playbook: Playbook, variables: Mapping[str, Any], *, check: bool = False,
                  force: bool = False, host_name: str = "") -> str:
    """Render the bash script for one host. Raises :class:`VariableError` for an undefined
    or ill-typed variable; a read-only playbook (``status``) always renders in check mode.
    """
    resolved = resolve_playbook(playbook, variables)
    check = check or playbook.read_only
    force = force or resolved.force
    where = "built-in" if playbook.builtin else playbook.path

    head = [
        "#!/usr/bin/env bash",
        f"# fleetclean {__version__}: playbook {playbook.name} ({where})",
        f"# host: {_comment_value(host_name)}  mode: {'check' if check else 'run'}"
        f"{'  force' if force else ''}",
        "# Runs as `bash -s` with this text on standard input. Records go to stdout as",
        "# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.",
        "# variables:",
        *(f"#   {k} = {_comment_value(variables[k])}" for k in sorted(variables)),
        "",
    ]
    used = dict.fromkeys(s.type for s in resolved.stages)
    parts = ["\n".join(head), template("lib.sh")]
    parts += [template(STAGE_TEMPLATES[t]) for t in used]
    if resolved.verify is not None:
        parts.append(template("verify.sh"))

    main = [
        "fc_main() {",
        "    export LC_ALL=C",
        f'    PATH="$PATH:{_PATH_TAIL}"',
        f"    FC_PLAYBOOK={q(playbook.name)}",
        f"    FC_HOST={q(host_name)}",
        f"    FC_CHECK={int(check)}",
        f"    FC_FORCE={int(force)}",
        f"    FC_LOCK_WAIT={resolved.lock_wait:g}",
        f"    FC_PROTECT=({' '.join(q(n) for n in resolved.protect)})",
        "    if ! fc_begin; then",
        '        fc_rec error "host busy: another fleetclean run holds $FC_LOCK_PATH"',
        "        fc_finish",
        "        return 0",
        "    fi",
    ]
    total = len(resolved.stages)
    for i, stage in enumerate(resolved.stages, start=1):
        main += ["", f"    # stage {i}/{total}: {_comment_value(stage.name)} ({stage.type})",
                 "    fc_reset_opts"]
        main += [f"    {line}" for line in _stage_assignments(stage)]
        main.append(f"    fc_stage {i} {q(stage.name)} {q(stage.type)}")
    if resolved.verify is not None:
        v = resolved.verify
        main += [
            "",
            "    # verify: every GPU at or under max_used_mib before the deadline",
            "    fc_reset_opts",
            f"    opt_max_used_mib={v['max_used_mib']}",
            f"    opt_timeout_ms={_seconds_ms(v['timeout'])}",
            f"    opt_interval_s={v['interval']:g}",
            f"    opt_settle_ms={_seconds_ms(v['settle'])}",
            "    fc_verify",
        ]
    main += ["    fc_finish", "}", "", "fc_main </dev/null", ""]
    parts.append("\n".join(main))
    return "\n".join(parts)
