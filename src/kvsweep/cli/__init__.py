"""The command line: `python -m kvsweep` runs a sweep (run.py); `report`, `sync` and `compare` are its subcommands."""

from kvsweep.cli.run import main

__all__ = ["main"]
