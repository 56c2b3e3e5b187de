"""One cell measured in this process, from the plain values a test writes (a cell and a protocol as dicts or
as objects), through the same typed request a sweep's actor hands `run_cell`."""

from collections.abc import Mapping, Sequence
from typing import Any

from kvsweep.cell.request import CellRequest, RunOptions
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.testing.testing_config import Seams


def request_for(
    cell: Cell | Mapping[str, Any],
    protocol: MeasureProtocol | Mapping[str, Any],
    faults: Sequence[Mapping[str, Any]] = (),
    split_devices: int = 0,
    **options: Any,
) -> CellRequest:
    """The request for `cell` measured under `protocol`, with these faults and run options (`RunOptions`)."""
    the_cell = cell if isinstance(cell, Cell) else Cell(**cell)
    the_protocol = protocol if isinstance(protocol, MeasureProtocol) else MeasureProtocol.from_dict(dict(protocol))
    seams = Seams(faults=[dict(f) for f in faults], split_devices=split_devices)
    return CellRequest(the_cell, the_protocol, RunOptions(**options), seams)


def measure_cell(
    cell: Cell | Mapping[str, Any],
    protocol: MeasureProtocol | Mapping[str, Any],
    faults: Sequence[Mapping[str, Any]] = (),
    **options: Any,
) -> dict[str, Any]:
    """`run_cell`'s result for that request."""
    from kvsweep.cell.run_cell import run_cell

    return run_cell(request_for(cell, protocol, faults, **options))
