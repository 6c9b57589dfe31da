"""``fleetclean completion bash|zsh``: a completion script generated from the parser itself.

Commands and options come from ``build_parser()``, so the script never lags behind the CLI;
built-in playbook names are read from the package when the script is generated; host and
group names come from the inventory given with ``-i`` on the line being completed, through
the hidden ``fleetclean __complete hosts -i FILE`` (so the inventory is read by fleetclean's
own loader, ranges and INI included). zsh uses the same function through ``bashcompinit``.
"""

from __future__ import annotations

import argparse

from fleetclean.commands.env import Env
from fleetclean.commands.parser import build_parser
from fleetclean.commands.steps import select_hosts
from fleetclean.errors import ExitStatus

# Options whose value is a file name / has no useful completion.
_FILE_OPTS = ("-i", "--inventory", "-F", "--ssh-config", "--known-hosts", "--prom",
              "--state-dir")
_HOST_OPTS = ("-l", "--limit", "--host")

_BASH = r"""# fleetclean completion for bash (and zsh via bashcompinit).
# Install: eval "$(fleetclean completion bash)" in ~/.bashrc, or save the output as
# ~/.local/share/bash-completion/completions/fleetclean
_fleetclean_inventory() {
    local i
    for ((i = 1; i < ${#COMP_WORDS[@]}; i++)); do
        case ${COMP_WORDS[i]} in
            -i | --inventory) printf '%s\n' "${COMP_WORDS[i + 1]}"; return ;;
            --inventory=*) printf '%s\n' "${COMP_WORDS[i]#--inventory=}"; return ;;
        esac
    done
}

_fleetclean() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]} cmd="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
            -*) ;;
            *)
                # A command with commands of its own (export script): both words name it.
                case $cmd in
                    GROUPS) cmd+="-${COMP_WORDS[i]}"; break ;;
                    "") cmd=${COMP_WORDS[i]} ;;
                esac
                case $cmd in
                    GROUPS) ;;
                    *) break ;;
                esac
                ;;
        esac
    done
    COMPREPLY=()
    case $prev in
        FILE_OPTS)
            local IFS=$'\n'  # file names may hold spaces
            COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
        HOST_OPTS)
            local inv
            inv=$(_fleetclean_inventory)
            if [ -n "$inv" ]; then
                COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" __complete hosts -i "$inv" \
                    2>/dev/null)" -- "$cur"))
            fi
            return 0 ;;
    esac
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "COMMANDS" -- "$cur")); return 0
    fi
    case $cur in
        -*)
            case $cmd in
OPTIONS
            esac
            return 0 ;;
    esac
    case $cmd in
        PLAYBOOK_CMDS)
            COMPREPLY=($(compgen -W "PLAYBOOKS" -- "$cur"))
            local IFS=$'\n'
            COMPREPLY+=($(compgen -f -- "$cur")) ;;
        report)
            local IFS=$'\n'
            COMPREPLY=($(compgen -f -- "$cur")) ;;
POSITIONALS
    esac
    return 0
}
complete -F _fleetclean fleetclean
"""

_ZSH_HEAD = """#compdef fleetclean
# fleetclean completion for zsh. Install: eval "$(fleetclean completion zsh)" in ~/.zshrc
autoload -U +X compinit && compinit -u
autoload -U +X bashcompinit && bashcompinit
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by the name the script gives it: ``run``, and for a command
    with commands of its own, each of those too (``export-script``)."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name, sp in _subparsers(parser).items():
        if name.startswith("_"):
            continue
        out[name] = sp
        for sub, ssp in _subparsers(sp).items():
            out[f"{name}-{sub}"] = ssp
    return out


def _takes_playbook(sp: argparse.ArgumentParser) -> bool:
    return any(a.dest == "playbook" for a in sp._actions)


def bash_script() -> str:
    from fleetclean.engine.playbook import list_playbooks

    parser = build_parser()
    subs = _commands(parser)
    groups = [name for name, sp in subs.items() if _subparsers(sp)]
    options = "\n".join(f"                {name}) COMPREPLY=($(compgen -W "
                        f"\"{' '.join(_options(sp))}\" -- \"$cur\")) ;;"
                        for name, sp in subs.items())
    positionals = []
    for name, sp in subs.items():
        words = [w for a in sp._actions if a.choices and not a.option_strings
                 for w in a.choices if not w.startswith("_")]
        if words:
            positionals.append(f"        {name}) COMPREPLY=($(compgen -W \"{' '.join(words)}\" "
                               "-- \"$cur\")) ;;")
    return (_BASH.replace("FILE_OPTS", " | ".join(_FILE_OPTS))
            .replace("HOST_OPTS", " | ".join(_HOST_OPTS))
            .replace("COMMANDS", " ".join([*(n for n in subs if "-" not in n),
                                           *_options(parser)]))
            .replace("GROUPS", " | ".join(groups))
            .replace("PLAYBOOK_CMDS", " | ".join(n for n, sp in subs.items()
                                                 if _takes_playbook(sp)))
            .replace("OPTIONS", options)
            .replace("PLAYBOOKS", " ".join(name for name, _ in list_playbooks()))
            .replace("POSITIONALS", "\n".join(positionals)))


def cmd_completion(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    script = bash_script()
    env.stdout.write(script if args.shell == "bash" else _ZSH_HEAD + script)
    return int(ExitStatus.OK)


def cmd_complete_names(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    """Names for the completion script, one a line: hosts and groups, or playbooks."""
    if args.what == "playbooks":
        from fleetclean.engine.playbook import list_playbooks

        names = [name for name, _ in list_playbooks()]
    else:
        if not (args.inventory or args.local):
            return int(ExitStatus.BAD_INPUT)
        hosts = select_hosts(args, env)
        groups = {g for h in hosts for g in h.groups}
        names = [h.name for h in hosts] + sorted(groups | {"all"})
    env.stdout.write("".join(f"{n}\n" for n in names))
    return int(ExitStatus.OK)
