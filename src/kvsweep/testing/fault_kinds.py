"""The fault names `testing.faults` accepts; apart from `faults.py` so config checks import no torch.

Most faults fire inside `generate`, in the measured calls (`measure`) or the quality check
(`quality`). `cuda_init` fires when the cell starts its device (`start`): CUDA's initialisation
raises, as it does on a driver older than the torch build.
"""

FAULTS = ("oom", "error", "hang", "exit", "recompile", "cuda_init")
PHASES = ("measure", "quality", "start")
START_FAULTS = ("cuda_init",)  # the faults of the `start` phase, and the only ones it takes


def default_phase(fault: str) -> str:
    """When a fault fires if the config does not say (`during`)."""
    return "start" if fault in START_FAULTS else "measure"
