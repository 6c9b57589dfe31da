"""Commands that show rather than run: ``show``, ``playbooks``, ``inventory``; and the
simulator's ``demo`` and ``sim``."""

from __future__ import annotations

import argparse
import json

from fleetclean.commands.env import Env
from fleetclean.commands.steps import (
    inventory_label,
    inventory_sources,
    render_jobs,
    scope_of,
    select_hosts,
)
from fleetclean.errors import ExitStatus, UsageError
from fleetclean.models import Host


def cmd_show(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    hosts: list[Host]
    if args.local or inventory_sources(args, env):
        hosts = select_hosts(args, env)
        if args.host:
            hosts = [h for h in hosts if h.name == args.host]
            if not hosts:
                raise UsageError(f"--host {args.host}: no such host in "
                                 f"{inventory_label(args, env)}",
                                 hint="see 'fleetclean inventory -i FILE'")
        hosts = hosts[:1]
    else:
        if args.host:
            raise UsageError("--host needs -i INVENTORY")
        hosts = [Host(name="HOST", address="HOST")]
    # The script as any run would send it, without this controller's notes of a host.
    _, jobs, _ = render_jobs(args.playbook, hosts, args.extra_vars, check=args.check,
                              force=False, scope=scope_of(args), unheard={})
    env.stdout.write(jobs[0].script)
    return int(ExitStatus.OK)


def cmd_playbooks(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.engine.playbook import list_playbooks

    for name, description in list_playbooks():
        env.stdout.write(f"{name:<18} {description}\n")
    return int(ExitStatus.OK)


def cmd_inventory(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.inventory import inventory_json, render_inventory_table

    hosts = select_hosts(args, env, warn=True)  # the command that checks an inventory
    if args.json:
        # One write (see output._emit_to)
        env.stdout.write(json.dumps(inventory_json(hosts), indent=2) + "\n")
    else:
        env.console().print(render_inventory_table(hosts))
    return int(ExitStatus.OK)


def cmd_demo(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.demo import run_demo

    return run_demo(env.console(), nodes=args.nodes, state_dir=args.state_dir)


def cmd_sim(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.sim import cli as sim_cli

    return sim_cli.run(args)
