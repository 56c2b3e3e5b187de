"""The host's preparation gate: nothing heavy starts on a CPU host while a cell there is measured.

A file lock per Ray session and host. Whatever prepares (a spare importing, a template starting)
holds it exclusively; a cell's measured phase holds it shared. Standard library only: the cell's
actor and its forked process both use it without importing torch; both run their cell through
`GatedRun`, which imports the runner when the cell starts.
"""

import contextlib
import fcntl
import importlib
import os
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvsweep.cell.request import CellRequest


def gate_path(session_name: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"kvsweep-gate-{session_name}.lock")


@contextlib.contextmanager
def host_gate(path: str, exclusive: bool) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class GatedRun:
    """Runs one cell where it is measured (the actor's process or a forked one) and is its `on_phase`.

    Each phase's time goes into `timeline`; the measured phase, "measuring" to "measured", holds the
    host's gate at `path` shared (an empty path: no gate, passed at once). A cell that fails inside its
    measured phase never says "measured": `run` lets go of the gate whatever happens.
    """

    def __init__(self, path: str, timeline: dict[str, float]) -> None:
        self.path, self.timeline = path, timeline
        self._held = contextlib.ExitStack()

    def run(self, request: "CellRequest") -> dict[str, Any]:
        """The cell's result from `run_cell`, or from the stand-in runner its seams name ("module:function")."""
        try:
            if request.seams.runner:
                module, _, function = request.seams.runner.partition(":")
                runner = getattr(importlib.import_module(module), function)
                self._imported()
                return runner(request)
            from kvsweep.cell.run_cell import run_cell

            self._imported()
            return run_cell(request, on_phase=self)
        finally:
            self.release()

    def __call__(self, name: str) -> None:
        self.timeline[f"{name}_at"] = time.time()
        if name == "measuring":  # wait until nothing prepares on this host, then keep everything out
            if self.path:
                self._held.enter_context(host_gate(self.path, exclusive=False))
            self.timeline["gate_passed_at"] = time.time() if self.path else self.timeline["measuring_at"]
        elif name == "measured":
            self.release()

    def release(self) -> None:
        self._held.close()

    def _imported(self) -> None:
        # A forked process has it already: when it started, since the template imported everything.
        self.timeline.setdefault("imported_at", time.time())
