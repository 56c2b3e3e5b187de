"""The fault names `testing.faults` accepts; apart from `faults.py` so config checks import no torch.

Most faults fire inside `generate`, in the measured calls (`measure`) or the quality check
(`quality`). `cuda_init` fires when the cell starts its device (`start`): CUDA's initialisation
raises, as it does on a driver older than the torch build. `slow` fails nothing: it sleeps
`ms_per_token` for every token (the first too), the regression `python -m kvsweep compare` must find.
"""

from dataclasses import dataclass

FAULTS = ("oom", "error", "hang", "exit", "recompile", "cuda_init", "slow")
PHASES = ("measure", "quality", "start")
START_FAULTS = ("cuda_init",)  # the faults of the `start` phase, and the only ones it takes


def default_phase(fault: str) -> str:
    """When a fault fires if the config does not say (`during`)."""
    return "start" if fault in START_FAULTS else "measure"


@dataclass(frozen=True)
class Fault:
    """A fault chosen for a cell: its kind and, for `slow`, the milliseconds added to each decode step."""

    kind: str
    ms_per_token: float = 0.0
