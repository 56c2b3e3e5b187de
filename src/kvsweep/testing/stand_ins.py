"""Test-only stand-in cell runners, selected with `testing.runner=kvsweep.testing.stand_ins:FUNCTION`.

They exercise the scheduler, placement and logging without loading a model, so scheduling can be
tested on simulated clusters and measured on 2,000-cell grids.
"""

import time
from typing import TYPE_CHECKING, Any

from kvsweep.names import Metric
from kvsweep.results import OK, CellResult

if TYPE_CHECKING:
    from kvsweep.cell.request import CellRequest


def sleep_cell(request: "CellRequest") -> dict[str, Any]:
    """'Measures' by sleeping `testing.sleep_s`; reports the sleep as its e2e time."""
    started = time.perf_counter()
    time.sleep(request.seams.sleep_s)
    elapsed_ms = (time.perf_counter() - started) * 1e3
    result = CellResult(request.cell_id, request.cell, OK, metrics={Metric.E2E_MS: elapsed_ms})
    return result.to_dict()


LEFT_BEHIND: list[Any] = []  # what a cell leaves in its process: a module global, a tensor


def state_cell(request: "CellRequest") -> dict[str, Any]:
    """Reports the process state it found, then leaves some behind (a global, a tensor, a compiled
    graph, a changed thread count) for the next cell to find, if processes were ever reused."""
    import os

    import torch
    from torch._dynamo.utils import counters

    found = {
        "pid": os.getpid(),
        "left_behind": len(LEFT_BEHIND),
        "threads": torch.get_num_threads(),
        "compiled_graphs": int(counters["stats"]["unique_graphs"]),
        "cpus": sorted(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
    }
    LEFT_BEHIND.append(torch.ones(1024))
    torch.set_num_threads(found["threads"] + 1)
    torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))
    result = CellResult(request.cell_id, request.cell, OK, metrics={Metric.E2E_MS: 1.0})
    result.environment["found"] = found
    return result.to_dict()


def environ_cell(request: "CellRequest") -> dict[str, Any]:
    """Reports the names of the process's environment variables (`environment.environ_names`); names
    only, so that no secret's value reaches a result."""
    import os

    result = CellResult(request.cell_id, request.cell, OK, metrics={Metric.E2E_MS: 1.0})
    result.environment["environ_names"] = sorted(os.environ)
    return result.to_dict()


def busy_cell(request: "CellRequest") -> dict[str, Any]:
    """Keeps one core busy for `testing.sleep_s`, as a GPU cell's kernel-launching thread does, while it
    meters the CPUs it may run on; tags the result with the host verdict a measured cell would get.

    `testing.start_at` (wall-clock seconds) opens the metered window then, not at once: concurrent cells
    then meter the same interval, with each one's start-up (fork, pinning, imports) over before it.
    `environment.metered_at` says when the window opened.
    """
    from kvsweep.measure.contention import HostEvidence, HostMeter
    from kvsweep.names import ResultTag

    meter = HostMeter()
    time.sleep(max(0.0, request.seams.start_at - time.time()))
    metered_at = time.time()
    meter.start()
    end = time.monotonic() + request.seams.sleep_s
    while time.monotonic() < end:
        pass
    reading = meter.stop()
    contended, contention = HostEvidence([reading], request.protocol.measure.max_host_contention).verdict()
    shares = reading.to_dict() if reading is not None else {}
    result = CellResult(request.cell_id, request.cell, OK, metrics={Metric.E2E_MS: 1.0, **shares})
    result.tags.update({ResultTag.CONTENDED: contended, ResultTag.CONTENTION: contention})
    result.environment.update(metered_cpus=",".join(map(str, meter.cpus)), metered_at=metered_at)
    return result.to_dict()
