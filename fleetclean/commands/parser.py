"""The whole command line as argparse parsers: commands, options, help with examples.

Building it imports no handler, no rich and no transport; the simulator's subcommands are
added only when the command word is ``sim``.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from fleetclean import __version__
from fleetclean.commands import become as become_options
from fleetclean.errors import UsageError
from fleetclean.slurm import options as slurm_options

EXIT_STATUS_HELP = """\
exit status: 0 every host clean, 1 some host dirty or faulty, 2 some host unreachable or
failed, 3 internal error (a bug: --debug shows its traceback), 4 bad input (nothing was
sent), 130 interrupted.
"""

EPILOG_RUN = """\
examples:
  fleetclean run post-extraction -i lab.yml -l extraction
  fleetclean run post-extraction -i lab.yml -e model_file=/opt/sglang/srt/models/deepseek_v2.py
  fleetclean run pre-restart -i lab.yml -l 'gpu0*:!gpu05' --check
  fleetclean run ./my-teardown.yaml -i hosts.ini -e @vars.yaml --json > result.json
  fleetclean run post-extraction -i lab.yml --prom /var/lib/node_exporter/fleetclean.prom
  fleetclean run post-extraction -i lab.yml -b -K        # root through sudo, password asked once
  fleetclean run free-gpus -i lab.yml -e owner_docker=signal -e never_stop_units=jupyter

owners: a target a systemd unit, docker or podman container runs is stopped through it
(owner_systemd, owner_docker, owner_podman: stop); a pod's or Slurm job's is left to its owner
(owner_kubernetes, owner_slurm: refuse; -e owner_slurm=stop cancels the job with scancel);
tmux, screen and plain ones are signalled.

""" + EXIT_STATUS_HELP

EPILOG_MAIN = """\
examples:
  fleetclean demo                                   a simulated fleet, cleaned end to end
  fleetclean status -i lab.yml                      per-host, per-GPU memory table
  fleetclean run post-extraction -i lab.yml --check what would be signalled, restored, removed
  fleetclean run post-extraction -i lab.yml         stop servers, free GPUs, verify
  fleetclean show post-extraction -i lab.yml --host gpu01   the exact bash sent to gpu01
  eval "$(fleetclean completion bash)"              tab completion in this shell

""" + EXIT_STATUS_HELP

class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad options; the contract says 4 and one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", hint=f"see '{self.prog} --help'")


def _global_opts(p: argparse.ArgumentParser, *, top: bool) -> None:
    # On every subcommand too (`fleetclean run ... --debug`); SUPPRESS there so that a
    # subcommand's default never overwrites the flag given before it.
    default: Any = False if top else argparse.SUPPRESS
    p.add_argument("--debug", action="store_true", default=default,
                   help="print the traceback of an internal error (or FLEETCLEAN_DEBUG=1)")
    p.add_argument("--no-color", action="store_true", default=default,
                   help="no colours (also when NO_COLOR is set)")


def hosts_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-i", "--inventory", action="append", metavar="SOURCE",
                    help="Ansible inventory (YAML or INI), or hosts inline: 'gpu01,gpu02,' "
                    "or 'gpu[01:16].lab,'; repeatable, later sources win; default "
                    "$FLEETCLEAN_INVENTORY")
    sp.add_argument("-c", "--connection", choices=("ssh", "local"),
                    help="reach every selected host this way (local: run here, no SSH)")
    sp.add_argument("--local", action="store_true",
                    help="this machine alone, named after its hostname, without SSH or -i")
    sp.add_argument("-l", "--limit", metavar="PATTERN",
                    help="select hosts: names, groups, globs, 'a:b', '&grp', '!grp', @file")
    sp.add_argument("-F", "--ssh-config", metavar="FILE",
                    help="ssh_config to honour, alone (default ~/.ssh/config then "
                    "/etc/ssh/ssh_config, as ssh reads them; or $FLEETCLEAN_SSH_CONFIG)")


def scope_opts(sp: argparse.ArgumentParser, *, signals: bool = True) -> None:
    """What a run may touch on a node other people use too."""
    sp.add_argument("--gpus", metavar="LIST",
                    help="only these GPUs (nvidia-smi's indexes: 0,3 or 2-5): their holders "
                    "alone are killed, they alone are judged (the others are shown)")
    if signals:
        sp.add_argument("--user", metavar="USER",
                        help="signal only USER's processes (a name or a UID), on every host")


def out_opts(sp: argparse.ArgumentParser) -> None:
    out = sp.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--csv", action="store_true", help="print one CSV row per host and GPU")
    sp.add_argument("--all", action="store_true",
                    help="list every host in the table; by default, past a screenful of "
                    "hosts, one line per status leads and only hosts not clean are listed")
    sp.add_argument("--prom", metavar="FILE",
                    help="also write the results in Prometheus text format (atomically), "
                    "e.g. for node_exporter's textfile collector")


def conn_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-f", "--forks", type=int, default=64, metavar="N",
                    help="hosts at once (default 64)")
    sp.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                    help="seconds to connect and authenticate (default 10)")
    sp.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds for the whole script on one host (default 300)")
    sp.add_argument("--known-hosts", action="append", default=[], metavar="FILE",
                    help="a known_hosts file read beside ~/.ssh/known_hosts (or ssh_config's "
                    "UserKnownHostsFile); new keys accepted go to the first one given")
    sp.add_argument("--accept-new-host-keys", action="store_true",
                    help="record unknown host keys (never changed ones), like "
                    "StrictHostKeyChecking=accept-new")
    out_opts(sp)


def _add_run(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    run = sub.add_parser("run", help="run a teardown playbook on the selected hosts",
                         description="Render PLAYBOOK into one bash script per host, run them in "
                         "parallel over SSH, verify every GPU is free.",
                         epilog=EPILOG_RUN, formatter_class=fmt)
    run.add_argument("playbook", metavar="PLAYBOOK", help="built-in name or a YAML file")
    hosts_opts(run)
    run.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                     help="set a variable; @file.yaml reads a file; repeatable")
    run.add_argument("--check", action="store_true",
                     help="list what each stage would signal, restore or remove; change nothing")
    run.add_argument("--force", action="store_true", help="override guard stages")
    run.add_argument("--no-record", action="store_true", help="do not write a run record")
    scope_opts(run)
    slurm_options.add_options(run)
    conn_opts(run)
    become_options.add_options(run)


def _add_status(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    status = sub.add_parser("status", help="read-only GPU memory table of the selected hosts",
                            epilog="examples:\n  fleetclean status -i lab.yml\n"
                            "  fleetclean status -i lab.yml -l training --watch 2\n\n"
                            "Each node picks its GPU read: `nvidia-smi --query-gpu` where its "
                            "kernel counts\nno CUDA process (/sys/module/nvidia_uvm/refcnt at "
                            "0; the compute apps only\nwhere a GPU is in use all the same), "
                            "`nvidia-smi -q` where it counts some, or\nwhere the host's last "
                            "status named processes (last-named.json in the state\ndirectory, "
                            "~/.local/state/fleetclean). Where the count cannot be\nread, a "
                            "host whose GPUs all read clean last time (last-clean.json) "
                            "reads\nthe query, any other -q. `fleetclean show status --host "
                            "H` shows the script.\n\n"
                            + EXIT_STATUS_HELP, formatter_class=fmt)
    hosts_opts(status)
    status.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                        help="set a variable of the status playbook (e.g. max_used_mib=512)")
    status.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="S",
                        help="refresh the table in place every S seconds (default 2), on "
                        "connections kept open between refreshes")
    scope_opts(status, signals=False)
    slurm_options.add_options(status)
    conn_opts(status)
    become_options.add_options(status)


def _add_show(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    show = sub.add_parser("show", help="print the exact script a host would receive",
                          epilog="examples:\n  fleetclean show post-extraction\n"
                          "  fleetclean show post-extraction -i lab.yml --host gpu01 -e grace=30\n",
                          formatter_class=fmt)
    show.add_argument("playbook", metavar="PLAYBOOK")
    hosts_opts(show)
    show.add_argument("--host", metavar="HOST", help="render with this host's variables")
    show.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--check", action="store_true", help="render the --check variant")
    scope_opts(show)


EPILOG_EXPORT = """\
examples:
  fleetclean export slurm-epilog post-extraction > /etc/slurm/epilog.d/50-fleetclean
  fleetclean export slurm-epilog pre-restart -e epilog_log=/var/log/slurm/fleetclean.log
  fleetclean export script post-extraction -i lab.yml > fc.sh
  clush -b -w gpu[01-16] 'bash -p -s' < fc.sh > out.txt 2>&1; fleetclean report out.txt
  fleetclean export script post-extraction -i lab.yml --plain | less   (to read it)
  fleetclean export script post-extraction -i lab.yml --pdsh > fc.pdsh
  pdsh -R ssh -w gpu[01-16] "$(cat fc.pdsh)" > out.txt 2>&1; fleetclean report out.txt
"""

EPILOG_REPORT = """\
examples:
  clush -b -w gpu[01-16] 'bash -p -s' < fc.sh > out.txt 2>&1; fleetclean report out.txt
  pdsh -R ssh -w gpu[01-16] "$(cat fc.pdsh)" 2>&1 | fleetclean report --from pdsh -
  srun -N16 -l bash -p fc.sh > out.txt 2>&1; fleetclean report --from srun --json out.txt
  fleetclean report node*/var/log/fleetclean/epilog.log    (each node's last epilog)

""" + EXIT_STATUS_HELP


def _add_fanout(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    export = sub.add_parser("export", help="print a script that runs without fleetclean: "
                            "Slurm's epilog, or a bundle for clush, pdsh or srun",
                            epilog=EPILOG_EXPORT, formatter_class=fmt)
    what = export.add_subparsers(dest="what", metavar="WHAT", parser_class=_Parser,
                                 required=True)
    epilog = what.add_parser(
        "slurm-epilog", help="a script for slurm.conf's Epilog=: after every job it cleans "
        "what the job left, verifies, and exits non-zero (Slurm drains) if still dirty",
        epilog=EPILOG_EXPORT, formatter_class=fmt)
    epilog.add_argument("playbook", metavar="PLAYBOOK", help="built-in name or a YAML file")
    epilog.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                        help="set a variable; epilog_log=PATH is where the records go on "
                        "the node (default /var/log/fleetclean/epilog.log)")
    script = what.add_parser(
        "script", help="one bundle for every host of the inventory, each running its own "
        "variables: for clush -b, pdsh or srun", epilog=EPILOG_EXPORT, formatter_class=fmt)
    script.add_argument("playbook", metavar="PLAYBOOK", help="built-in name or a YAML file")
    hosts_opts(script)
    script.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                        help="set a variable; @file.yaml reads a file; repeatable")
    script.add_argument("--check", action="store_true",
                        help="the hosts list what they would do, and change nothing")
    script.add_argument("--force", action="store_true", help="override guard stages")
    form = script.add_mutually_exclusive_group()
    form.add_argument("--pdsh", action="store_true",
                      help="for pdsh's command line: the script as text with every %% "
                      "doubled, since pdsh turns %%%% into %% and %%h into the host's name "
                      "in the command it runs")
    form.add_argument("--plain", action="store_true",
                      help="the script as text, to read it or to run it as a file (bash "
                      "FILE, srun). Without it the script is in base64, for clush's "
                      "'bash -s': a login shell's startup file that takes its start then "
                      "leaves nothing of it run, instead of the rest")
    scope_opts(script)
    for sp in (epilog, script):
        _global_opts(sp, top=False)

    report = sub.add_parser("report", help="what clush, pdsh, srun or an epilog printed -> "
                            "the table, --json and exit status of a run",
                            epilog=EPILOG_REPORT, formatter_class=fmt)
    report.add_argument("files", nargs="+", metavar="FILE",
                        help="saved output (stdout and stderr together); - for stdin")
    report.add_argument("--from", dest="source", default="auto",
                        choices=("auto", "clush", "pdsh", "srun", "raw"),
                        help="the tool that printed it (default: told from the text)")
    out_opts(report)


def _add_others(sub: Any, fmt: type[argparse.HelpFormatter], *, with_sim: bool) -> None:
    sub.add_parser("playbooks", help="list built-in playbooks",
                   epilog="examples:\n  fleetclean playbooks\n"
                   "  fleetclean show post-extraction --local   # what one of them runs\n",
                   formatter_class=fmt)

    inv = sub.add_parser("inventory", help="show selected hosts with effective settings",
                         epilog="examples:\n  fleetclean inventory -i lab.yml -l training --json\n",
                         formatter_class=fmt)
    hosts_opts(inv)
    inv.add_argument("--json", action="store_true")

    hist = sub.add_parser("history", help="list run records, or show one",
                          epilog="examples:\n  fleetclean history\n  fleetclean history -1\n",
                          formatter_class=fmt)
    hist.add_argument("record", nargs="?", metavar="ID", help="record id prefix, path, or -1")
    hist.add_argument("--json", action="store_true")

    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                          epilog='install:\n  eval "$(fleetclean completion bash)"   '
                          "# in ~/.bashrc\n  eval \"$(fleetclean completion zsh)\"    "
                          "# in ~/.zshrc\n", formatter_class=fmt)
    comp.add_argument("shell", choices=("bash", "zsh"))
    # No help: the completion script's own helper, kept out of --help.
    names = sub.add_parser("__complete")
    names.add_argument("what", choices=("hosts", "playbooks"))
    hosts_opts(names)

    demo = sub.add_parser("demo", help="clean a local simulated fleet end to end (Linux, root)",
                          epilog="examples:\n  sudo fleetclean demo\n"
                          "  sudo fleetclean demo --nodes 16\n", formatter_class=fmt)
    demo.add_argument("--nodes", type=int, default=4, metavar="N")
    demo.add_argument("--state-dir", metavar="DIR", help="where the simulated fleet lives")

    sim = sub.add_parser("sim", help="drive the simulated fleet by hand (Linux, root)",
                         epilog="examples:\n  fleetclean sim up --nodes 8 --state-dir /tmp/f\n"
                         "  fleetclean sim spawn node01 sglang --state-dir /tmp/f\n"
                         "  fleetclean status -i /tmp/f/inventory.yaml\n"
                         "  fleetclean sim down --state-dir /tmp/f\n", formatter_class=fmt)
    if with_sim:
        from fleetclean.sim import cli as sim_cli

        sim_cli.add_subparsers(sim)


def build_parser(*, with_sim: bool = True) -> argparse.ArgumentParser:
    """The whole command line; ``with_sim=False`` leaves out the simulator's subcommands,
    whose parser imports the simulator (yaml, its node code): ~10 ms of every start-up."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="fleetclean",
        description="Clean a fleet of GPU nodes over SSH: stop inference servers and their "
        "stray workers, free every GPU, put patched files back, and show a per-host, "
        "per-GPU memory table that proves it.",
        epilog=EPILOG_MAIN,
        formatter_class=fmt,
    )
    p.add_argument("--version", action="version", version=f"fleetclean {__version__}")
    _global_opts(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (_add_run, _add_status, _add_show, _add_fanout):
        add(sub, fmt)
    _add_others(sub, fmt, with_sim=with_sim)
    for sp in sub.choices.values():
        _global_opts(sp, top=False)
    return p
