"""A node's warm template: fresh cell processes forked from a process that has already imported.

Importing torch, Transformers and the quantization backends costs a fresh process seconds of CPU (BENCHMARKS.md).
One `CellTemplate` actor per node owns Python's `forkserver`, preloaded with the cell code (`cell/forked.py`);
each cell's measurement runs in a new process forked from it. The cell's own actor (`cell/actor.py`) still holds
its GPUs; the forked process kills itself the moment that actor is gone (a timeout, Ctrl-C), so Ray's accounting
and the reliability rules stay as they were. The forkserver must stay CUDA-clean (CUDA does not survive a fork):
its device checks use NVML, and a template whose imports initialised CUDA refuses to fork. It also lends its
node's cores (`take_cpus`, `cell/cpu_slots.py`), taken back when the cell's process has ended.
"""

import contextlib
import multiprocessing
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

from kvsweep.cell.cpu_slots import CpuGrant, CpuSlots, read_places
from kvsweep.cell.process import NO_RESULT, NVML_CHECK

FORKED_MODULE = "kvsweep.cell.forked"
POLL_S = 0.2
# The key of the answer a forked process sends in place of a result it could not build or send (an
# unreadable request, an exception whose error result itself failed): the message saying why.


class TemplateError(RuntimeError):
    """The template cannot fork clean cell processes (CUDA initialised by an import, preload failed)."""


class CellTemplate:
    """Lives as long as the sweep, one per node; `measure` may serve several cells at once (threaded)."""

    def __init__(self) -> None:
        # torch.cuda.is_available() then asks NVML instead of cuInit, so forked processes may still start CUDA.
        # Kept for this actor's whole life: a forkserver that dies is restarted with this environment, and
        # `_fork` imports the cell code here too. Each cell's process drops it first thing (`cell/forked.py`).
        os.environ[NVML_CHECK] = "1"
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload([FORKED_MODULE])
        self.started_at = time.time()
        self.cpu_slots = CpuSlots(read_places(sorted(os.sched_getaffinity(0))))
        self.state = self._probe()

    def _probe(self) -> dict[str, Any]:
        """Start the forkserver now (outside every cell) and check what a forked process inherits."""
        reply = self._fork({"probe": True})
        state = reply.get("result")
        if state is None:
            raise TemplateError(f"the template's first process died (exit code {reply['exitcode']})")
        if NO_RESULT in state:  # it could not even check: why not
            raise TemplateError(f"the template's first process failed: {state[NO_RESULT]}")
        if not state["preloaded"]:  # multiprocessing ignores a preload import that failed
            raise TemplateError(f"the template did not preload {FORKED_MODULE}; its processes would import it")
        if state["cuda_initialized"] or state["libcuda_mapped"]:
            raise TemplateError(
                "CUDA was initialised while preloading the cell code; forked cells could not use the GPU "
                f"(torch.cuda.is_initialized={state['cuda_initialized']}, libcuda mapped={state['libcuda_mapped']})"
            )
        return state

    def ready(self) -> dict[str, Any]:
        return {**self.state, "template_started_at": self.started_at, "template_pid": os.getpid()}

    def identity(self) -> str:
        """Which template a cell came from: its node-local process and when it started."""
        return f"pid {os.getpid()} forkserver {self.state.get('forkserver_pid')} started {self.started_at:.3f}"

    def take_cpus(self, wanted: int, owner_pid: int, near: int = -1) -> CpuGrant:
        """`wanted` of this node's cores for one cell alone, on NUMA node `near` (its GPUs') when it has room,
        held until `measure(..., slot)` returns (or `owner_pid` is gone); no slot, and why, when that many
        are not free."""
        return self.cpu_slots.take(wanted, owner_pid, near)

    def measure(self, request: bytes, slot: int = 0) -> dict[str, Any]:
        """Fork a fresh process for one cell (its request cloudpickled); returns its result, or how it
        died (`exitcode`). The process dies with the cell's actor, so this returns; `slot` is lent to
        that process alone until it has ended (its actor may be gone well before), then goes back."""
        with self.cpu_slots.in_measure(slot):
            reply = self._fork(request)
        reply["template"] = self.identity()
        return reply

    def _fork(self, request: bytes | dict[str, Any]) -> dict[str, Any]:
        from kvsweep.cell.forked import forked_main

        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(target=forked_main, args=(send, request), daemon=False)
        forked_at = time.time()
        with _no_main_module():
            process.start()
        send.close()
        result = None
        try:
            while result is None:
                if receive.poll(POLL_S):
                    result = receive.recv()
                elif not process.is_alive():
                    break
        except EOFError:  # the process died before it could answer
            result = None
        received_at = time.time()
        process.join()
        receive.close()
        times = {"forked_at": forked_at, "received_at": received_at, "exited_at": time.time()}
        return {"result": result, "exitcode": process.exitcode, "pid": process.pid, **times}


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_main_module() -> Iterator[None]:
    """Start a process without multiprocessing re-running this process's `__main__` in it.

    multiprocessing re-imports the parent's main script in every child (here Ray's worker script, or
    a test's); the cell needs nothing from it, and it costs the import of Ray. A bare `__main__` while
    `start` prepares the child's data leaves it out.
    """
    with _MAIN_LOCK:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main
