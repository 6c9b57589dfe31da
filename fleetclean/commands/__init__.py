"""Subcommand handlers, one module per job; ``fleetclean.cli`` parses and maps errors."""
