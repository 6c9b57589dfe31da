"""fleetclean: clean a fleet of GPU nodes over SSH and prove every GPU is free."""

__version__ = "0.1.0"
