"""Inventories -> hosts, one module per step:

- :mod:`.yaml_file`, :mod:`.ini_file`: the text of a source -> a :mod:`.builder` of groups,
  hosts and variables with the line each came from (:mod:`.ranges` expands ``gpu[01:16]``);
- :mod:`.vars_dirs`: the ``group_vars/`` and ``host_vars/`` beside an inventory file;
- :mod:`.build`: precedence, then one :class:`~fleetclean.models.Host` per host, with
  :mod:`.ssh_settings` filling what the inventory leaves open from ``~/.ssh/config``;
- :mod:`.inline`: host lists given to ``-i`` (``'gpu01,gpu02,'``);
- :mod:`.load`: which reader a source needs, and the public :func:`load_inventory`;
- :mod:`.limit`: ``-l`` patterns -> host names; :mod:`.present`: ``fleetclean inventory``.
"""

from fleetclean.inventory.build import Inventory
from fleetclean.inventory.load import load_inventory, local_inventory
from fleetclean.inventory.present import inventory_json, render_inventory_table

__all__ = [
    "Inventory",
    "inventory_json",
    "load_inventory",
    "local_inventory",
    "render_inventory_table",
]
