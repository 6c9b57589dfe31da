"""Inventories -> hosts: Ansible YAML/INI files, ranges, ``--limit`` and ssh settings."""

from fleetclean.inventory.load import (
    Inventory,
    inventory_json,
    load_inventory,
    render_inventory_table,
)

__all__ = ["Inventory", "inventory_json", "load_inventory", "render_inventory_table"]
