"""The command line: `python -m kvsweep` runs a sweep (run.py); `report` and `sync` are its subcommands."""

from kvsweep.cli.run import main

__all__ = ["main"]
