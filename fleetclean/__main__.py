"""``python -m fleetclean`` is the ``fleetclean`` command."""

from fleetclean.cli import entry

entry()
