"""Test-only stand-in cell runners, selected with `testing.runner=kvsweep.testing.stand_ins:FUNCTION`.

They exercise the scheduler, placement and logging without loading a model, so scheduling can be
tested on simulated clusters and measured on 2,000-cell grids.
"""

import time
from typing import Any

from kvsweep.grid import Cell, Protocol, cell_id
from kvsweep.results import OK, CellResult


def sleep_cell(cell: dict[str, Any], protocol: dict[str, Any], testing: dict[str, Any]) -> dict[str, Any]:
    """'Measures' by sleeping `testing.sleep_s`; reports the sleep as its e2e time."""
    started = time.perf_counter()
    time.sleep(float(testing.get("sleep_s", 0.0)))
    elapsed_ms = (time.perf_counter() - started) * 1e3
    result = CellResult(cell_id(Cell(**cell), Protocol(**protocol)), cell, OK, metrics={"e2e_ms": elapsed_ms})
    return result.to_dict()
