"""The cell's side of Ray: an actor that lives for exactly one cell, and the host's preparation gate.

The driver (`driver/scheduler.py`) creates one `CellActor` per cell (or a spare ahead of need) and
kills it when the cell is done. Inside, `run` measures the cell with `cell/run.py`. A spare has only
imported the cell code; on a CPU host it imports under the host's gate held exclusively, and a cell's
measured phase holds the gate shared, so no spare prepares while a cell on this host is measured.
"""

import contextlib
import fcntl
import importlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

RUNNER_MODULE = "kvsweep.cell.run"


class CellActor:
    """Lives for exactly one cell so that nothing (memory, compiled graphs, threads) leaks between cells.

    `prepare` names a module to import now (a spare: the cell comes later); `requested_at` is when the
    driver asked for the actor. Timestamps of every phase go into the result's `environment.timeline`.
    """

    def __init__(self, prepare: str = "", requested_at: float = 0.0, gated: bool = True) -> None:
        self.timeline: dict[str, float] = {"requested_at": requested_at}
        self.timeline["process_started_at"] = process_started_at()
        self.timeline["actor_init_at"] = time.time()
        self._measuring: Any = None
        self._gated = gated
        if prepare:
            with host_gate(exclusive=True) if gated else contextlib.nullcontext():
                self.timeline["prepare_at"] = time.time()
                importlib.import_module(prepare)
            self.timeline["prepared_at"] = time.time()

    def ready(self) -> bool:
        return True

    def run(self, cell: dict, protocol: dict, testing: dict, options: dict) -> dict:
        started_at = time.time()
        self.timeline["run_at"] = started_at
        if testing.get("runner"):
            module, _, function = testing["runner"].partition(":")
            runner = getattr(importlib.import_module(module), function)
            self.timeline["imported_at"] = time.time()
            result = runner(cell, protocol, testing)
        else:
            from kvsweep.cell.run import run_cell

            self.timeline["imported_at"] = time.time()
            result = run_cell(cell, protocol, testing.get("faults", []), on_phase=self._phase, **options)
        if self._measuring is not None:  # the cell failed inside its measured phase
            self._measuring.__exit__(None, None, None)
        context = ray.get_runtime_context()
        ended_at = time.time()
        self.timeline["returned_at"] = ended_at
        result["environment"].update(
            ray_node_id=context.get_node_id(),
            gpu_ids=",".join(str(g) for g in ray.get_gpu_ids()),
            started_at=started_at,
            ended_at=ended_at,
            timeline={k: round(v, 3) for k, v in self.timeline.items() if v},
        )
        return result

    def _phase(self, name: str) -> None:
        self.timeline[f"{name}_at"] = time.time()
        if name == "measuring" and self._gated:  # wait until no spare imports on this host, then keep them out
            self._measuring = host_gate(exclusive=False)
            self._measuring.__enter__()
            self.timeline["gate_passed_at"] = time.time()
        elif name == "measured" and self._measuring is not None:
            self._measuring.__exit__(None, None, None)
            self._measuring = None


def process_started_at() -> float:
    """Wall-clock start of this process from /proc (psutil's create_time is only good to a second)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@contextlib.contextmanager
def host_gate(exclusive: bool) -> Iterator[None]:
    """The host's preparation gate for this Ray session: spares hold it exclusively, measured phases shared."""
    path = os.path.join(tempfile.gettempdir(), f"kvsweep-gate-{ray.get_runtime_context().get_session_name()}.lock")
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
