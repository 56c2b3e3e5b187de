"""The fault names `testing.faults` accepts; apart from `faults.py` so config checks import no torch."""

FAULTS = ("oom", "error", "hang", "exit", "recompile")
PHASES = ("measure", "quality")
