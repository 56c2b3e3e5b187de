"""What differs between the two sweeps' environments and protocols: the first thing to read.

The environment comes from the cells' own records (what each cell's process found: torch,
Transformers, CUDA, the driver, the device, kvsweep, the host), so a sweep whose cells ran on two
kinds of node shows both. The protocol comes from the parent runs' `measure.*` and `inputs.*`
params: cells are matched across protocols, and the header says when they differ.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvsweep.results import CellResult

ENVIRONMENT_FIELDS = (
    ("torch", "torch_version"),
    ("transformers", "transformers_version"),
    ("CUDA", "cuda_version"),
    ("driver", "driver_version"),
    ("device", "device_name"),
    ("kvsweep", "kvsweep_version"),
    ("node software", "node_software"),  # a hash of the node's packages and kvsweep's sources (software_survey.py)
    ("host", "hostname"),
    ("python", "python_version"),
)
PROTOCOL_PREFIXES = ("measure.", "inputs.")


@dataclass(frozen=True)
class Difference:
    what: str
    a: str
    b: str


def recorded(results: Iterable[CellResult], key: str) -> str:
    """Every value the cells recorded for one field, sorted and joined ("" when none did)."""
    return ", ".join(sorted({str(r.environment[key]) for r in results if r.environment.get(key) not in (None, "")}))


def environment_differences(a: list[CellResult], b: list[CellResult]) -> list[Difference]:
    found = [(label, recorded(a, key), recorded(b, key)) for label, key in ENVIRONMENT_FIELDS]
    return [Difference(label, x or "-", y or "-") for label, x, y in found if x != y]


def environment_same(a: list[CellResult], b: list[CellResult]) -> list[Difference]:
    """The fields both sweeps recorded alike (the header names them, so 'nothing differs' is checkable)."""
    found = [(label, recorded(a, key), recorded(b, key)) for label, key in ENVIRONMENT_FIELDS]
    return [Difference(label, x, y) for label, x, y in found if x == y and x]


def protocol_differences(a: Mapping[str, str], b: Mapping[str, str]) -> list[Difference]:
    keys = sorted(k for k in a.keys() | b.keys() if k.startswith(PROTOCOL_PREFIXES))
    return [Difference(k, a.get(k, "-"), b.get(k, "-")) for k in keys if a.get(k) != b.get(k)]
