"""The simulated node's conmon: the monitor Podman starts for each container.

Runs inside a node (standard library only), exec'd by ``podmancli.py`` after a double
fork (so its parent is the node's init, as a real conmon's is PID 1 or the user's systemd),
with conmon's own arguments; its command line reads as real conmon's does::

    /usr/bin/conmon --api-version 1 -c ID -u ID -r /usr/bin/crun -b BUNDLE -p PIDFILE -n NAME
        --exit-dir DIR --persist-dir DIR/ID --full-attach -s -l journald --log-level warning
        --syslog --conmon-pidfile FILE --exit-command /usr/bin/podman --exit-command-arg ...

It joins its own cgroup (``libpod-conmon-ID.scope``; none where a systemd unit ran
podman, INVOCATION_ID set: it stays in the unit's, as podman leaves it), then does what
the containerd shim of ``containers.py`` does (subreaper, a PID namespace, the
container's init in the container's cgroup, from the bundle's ``config.json``: ``args``,
``env``, ``cgroup``, ``conmon_cgroup``), and reports the init's PID on ``_OCI_SYNCPIPE``.
When the init is gone it writes the exit code to ``EXIT_DIR/ID`` and runs its exit
command (``podman container cleanup ID``), which carries out the container's restart
policy, as podman's does. (That command is run by a helper forked before the PID
namespace is made, so that it runs in the node's: a real conmon never joins the
container's namespace.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

if __package__:
    from fleetclean.sim import containers, nodecg
    from fleetclean.sim.proctitle import set_plain_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import containers  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    from proctitle import set_plain_title  # type: ignore[import-not-found,no-redef]

PROGRAM = "/usr/bin/conmon"


FLAGS = {"--full-attach", "-s", "--systemd-cgroup", "--syslog"}


def parse(argv: list[str]) -> dict[str, list[str]]:
    """conmon's options by name, each with its values in order (every option but a flag
    takes the next word, even one that starts with '-': ``--exit-command-arg --root``).

    >>> parse(["-c", "ab", "--syslog", "--exit-command-arg", "--root"])["--exit-command-arg"]
    ['--root']
    """
    opts: dict[str, list[str]] = {}
    words = iter(argv)
    for word in words:
        opts.setdefault(word, []).append("" if word in FLAGS else next(words, ""))
    return opts


def main(argv: list[str]) -> None:
    opts = parse(argv)
    cid, exit_dir = opts["-c"][0], opts["--exit-dir"][0]
    command = opts.get("--exit-command", []) + opts.get("--exit-command-arg", [])
    with open(os.path.join(opts["-b"][0], "config.json")) as f:
        config = json.load(f)
    tree = nodecg.Tree.load()
    if config["conmon_cgroup"]:  # else its caller's: a unit's, INVOCATION_ID being set
        tree.place(0, nodecg.everywhere(config["conmon_cgroup"]))
    report = int(os.environ.pop("_OCI_SYNCPIPE"))
    for path in opts.get("--conmon-pidfile", []):
        with open(path, "w") as f:
            f.write(f"{os.getpid()}\n")

    title = " ".join([PROGRAM, *argv])
    # The monitor below unshares a PID namespace for the container, which every child it
    # forks after joins: once the container's init is gone, the kernel refuses a fork
    # there. Its exit command is run by a helper forked now, in the node's namespace.
    rfd, wfd = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(wfd)
        os.close(report)
        set_plain_title(title, "conmon")
        with os.fdopen(rfd, "rb") as pipe:
            told = pipe.read(1)
        if told and command:
            # As conmon's do_exit_command: run it, wait for it, then exit.
            subprocess.run(command, check=False, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=dict(os.environ))
        os._exit(0)
    os.close(rfd)

    def ended(code: int) -> None:
        os.makedirs(exit_dir, exist_ok=True)
        with open(os.path.join(exit_dir, cid), "w") as f:
            f.write(str(code))
        os.write(wfd, b"x")
        os.close(wfd)
        os.waitpid(helper, 0)

    containers.run_shim(config["args"], config["env"], config["cgroup"],
                        title=title, comm="conmon", tree=tree,
                        report=report, exec_socket="", on_end=ended)


if __name__ == "__main__":
    main(sys.argv[1:])
