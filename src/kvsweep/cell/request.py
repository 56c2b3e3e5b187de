"""What a cell is asked to measure, as one typed value: the driver builds one per job, it crosses Ray as one
object, and the actor, the forked process, the host gate and `run_cell` all take it. Free of torch: the
actor reads it before anything heavy is imported.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvsweep.caches.strategy import CacheStrategy
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.node_software import SoftwareCheck
from kvsweep.testing.testing_config import Seams


@dataclass(frozen=True)
class RunOptions:
    """How the sweep runs its cells, the same for every cell (none of it changes what a cell measures)."""

    trust_remote_code: bool = False
    strategies: tuple[CacheStrategy, ...] = ()  # registered in the driver beyond the built-ins: learnt first
    hub_cache: Mapping[str, str] = field(default_factory=dict)  # Hub models fetched before any cell -> cache
    cpus_per_cell: int = 0  # what Ray reserved for the cell's actor (0: not known), for its thread count
    software: SoftwareCheck = field(default_factory=SoftwareCheck)  # a node the survey did not see: checked first


@dataclass(frozen=True)
class CellRequest:
    """One cell to measure: the cell, how it is measured, how the sweep runs it, and the test seams."""

    cell: Cell
    protocol: MeasureProtocol
    options: RunOptions = field(default_factory=RunOptions)
    seams: Seams = field(default_factory=Seams)  # empty in a user's sweep

    @property
    def cell_id(self) -> str:
        return cell_id(self.cell, self.protocol)
