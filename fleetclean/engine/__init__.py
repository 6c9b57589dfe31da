"""Playbook YAML -> resolved stages -> one bash script per host. Pure: no SSH, no printing.

The steps, each its own module:

- :mod:`~fleetclean.engine.playbook`: YAML -> :class:`~fleetclean.engine.model.Playbook`
  (values as written), every mistake reported at its file:line:column;
- :mod:`~fleetclean.engine.variables`: precedence and ``-e`` -> one host's
  :class:`~fleetclean.engine.model.ResolvedPlaybook` (resolved once, checked by
  :mod:`~fleetclean.engine.checks` through :mod:`~fleetclean.engine.substitute`);
- :mod:`~fleetclean.engine.render`: ResolvedPlaybook -> the bash script;
- :mod:`~fleetclean.engine.stages`: the registry of stage types, one module per type
  beside its ``.sh`` template, with ``lib.sh`` (the runtime every script carries).

Built-in playbooks are data in ``engine/playbooks/``. The script's records are read back
by :mod:`fleetclean.results.parse`, which asks the same registry for stage-specific ones.

>>> from fleetclean.engine.playbook import load_playbook
>>> from fleetclean.engine.render import render_script
>>> from fleetclean.engine.variables import resolve
>>> script = render_script(resolve(load_playbook("status"), {}, {}), host_name="gpu01")
>>> "FC_CHECK=1" in script  # status is read-only: always check mode
True
"""
