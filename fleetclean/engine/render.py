"""A :class:`ResolvedPlaybook` -> one bash script for one host. Pure: reads only
package templates, resolves nothing (``fleetclean.engine.variables.resolve`` did).

The script is the stage library (``stages/lib.sh``), the further libraries the playbook's
stage types call into (``lib-kill.sh``, owner attribution ``owner.sh`` and acting through
the owner ``owner-act.sh`` for those that signal; ``owner.sh`` for the verification too,
which names the owner of each GPU holder), the templates of the stage types the playbook
uses, and an ``fc_main`` function that assigns each stage's options as shell-quoted
variables and calls the stage. Nothing runs until the script's last line,
``fc_main </dev/null``: a connection cut while the script travels runs nothing, and no
command inside can read the rest of the script from standard input.

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
from fleetclean.engine.model import ResolvedPlaybook
from fleetclean.engine.stages import stage_type, template
from fleetclean.engine.stages.base import q
from fleetclean.engine.stages.verify import VERIFY

# Non-interactive SSH shells often lack the sbin directories; ours come after the caller's.
_PATH_TAIL = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _comment_value(value: Any) -> str:
    # JSON keeps newlines and quotes of hostile values on one comment line.
    return json.dumps(value, default=str, ensure_ascii=False)


def render_script(resolved: ResolvedPlaybook, *, check: bool = False, force: bool = False,
                  host_name: str = "") -> str:
    """Render the bash script for one host; a read-only playbook (``status``) always
    renders in check mode, and ``force`` set in the variables counts as ``--force``."""
    check = check or resolved.read_only
    force = force or resolved.force
    used = dict.fromkeys(s.type for s in resolved.stages)
    libraries = dict.fromkeys(lib for t in used for lib in stage_type(t).libraries)
    if resolved.verify is not None:
        libraries.update(dict.fromkeys(VERIFY.libraries))
    parts = [_header(resolved, check, force, host_name), template("lib.sh")]
    parts += [template(lib) for lib in libraries]
    parts += [stage_type(t).template.read_text(encoding="utf-8") for t in used]
    if resolved.verify is not None:
        parts.append(VERIFY.template.read_text(encoding="utf-8"))
    parts.append("\n".join(_main(resolved, check, force, host_name,
                                  acts="owner-act.sh" in libraries)))
    return "\n".join(parts)


def _header(resolved: ResolvedPlaybook, check: bool, force: bool, host_name: str) -> str:
    where = "built-in" if resolved.builtin else resolved.path
    variables = resolved.variables
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# fleetclean {__version__}: playbook {resolved.name} ({where})",
        f"# host: {_comment_value(host_name)}  mode: {'check' if check else 'run'}"
        f"{'  force' if force else ''}",
        "# Runs as `bash -s` with this text on standard input. Records go to stdout as",
        "# '@@fleetclean<TAB>kind<TAB>fields...' lines, fields percent-encoded.",
        "# variables:",
        *(f"#   {k} = {_comment_value(variables[k])}" for k in sorted(variables)),
        "",
    ])


def _owner_lines(resolved: ResolvedPlaybook) -> list[str]:
    acts = " ".join(f"[{kind}]={q(act)}" for kind, act in resolved.owner_actions.items())
    return [f"    FC_OWNER_ACT=({acts})",
            f"    FC_NEVER_STOP=({' '.join(q(u) for u in resolved.never_stop_units)})"]


def _main(resolved: ResolvedPlaybook, check: bool, force: bool, host_name: str,
          acts: bool) -> list[str]:
    main = [
        "fc_main() {",
        "    export LC_ALL=C",
        f'    PATH="$PATH:{_PATH_TAIL}"',
        f"    FC_PLAYBOOK={q(resolved.name)}",
        f"    FC_HOST={q(host_name)}",
        f"    FC_CHECK={int(check)}",
        f"    FC_FORCE={int(force)}",
        f"    FC_LOCK_WAIT={resolved.lock_wait:g}",
        f"    FC_PROTECT=({' '.join(q(n) for n in resolved.protect)})",
        *(_owner_lines(resolved) if acts else []),
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
        main += [f"    {line}" for line in stage_type(stage.type).assignments(stage)]
        main.append(f"    fc_stage {i} {q(stage.name)} {q(stage.type)}")
    if resolved.verify is not None:
        main += ["", "    # verify: every GPU at or under max_used_mib before the deadline",
                 "    fc_reset_opts"]
        main += [f"    {line}" for line in VERIFY.assignments(resolved.verify)]
        main.append("    fc_verify")
    main += ["    fc_finish", "}", "", "fc_main </dev/null", ""]
    return main
