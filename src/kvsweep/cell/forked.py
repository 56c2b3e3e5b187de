"""What runs in a cell's forked process, and what the template preloads before forking it.

Importing this module is the template's preload: torch, Transformers, the quantization backends when
installed, and kvsweep's cell code, without touching CUDA. `forked_main` then takes on the cell's
actor's view of the machine (its `CUDA_VISIBLE_DEVICES`, thread count and CPUs), watches that actor,
measures the cell and sends the result back through the pipe. Whatever fails in this process comes
back as the cell's `error` result with its message, never as a bare exit code. A CUDA cell starts NVML
afresh first (`cell/process.py`: the forkserver's NVML does not survive the fork) and records what
came of it (`environment.nvml`).
"""

import contextlib
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

PRELOADED_AT = time.time()  # before the heavy imports: a forked process finds it older than itself

import cloudpickle  # noqa: E402, F401  (what unpickles an envelope)
import torch  # noqa: E402  (the preload: what a fresh process would spend seconds importing)
import transformers  # noqa: E402, F401

from kvsweep.cell.cpu_slots import pid_alive  # noqa: E402
from kvsweep.cell.process import NO_RESULT, NVML_CHECK, GatedRun, process_started_at, restart_nvml  # noqa: E402
from kvsweep.cell.run_cell import MAX_ERROR_CHARS, record_failure  # noqa: E402
from kvsweep.models.presets import PRESETS  # noqa: E402
from kvsweep.results import ERROR, CellResult  # noqa: E402

PRESET_MODEL_TYPES = sorted({preset.model_type for preset in PRESETS.values()})

# optimum.quanto reads every GPU's compute capability when it is imported where CUDA is available
# (its CUDA extension's `get_max_cuda_arch`), which initialises CUDA: on a GPU host its import is
# left to the cells that use it. (`torch.cuda.is_available` asks NVML here and initialises nothing.)
CUDA_TOUCHING_IMPORTS = ("optimum.quanto",)

for _backend in ("optimum.quanto", "hqq"):  # whichever quantized backends are installed
    if _backend in CUDA_TOUCHING_IMPORTS and torch.cuda.is_available():
        continue
    if importlib.util.find_spec(_backend.split(".")[0]) is not None:
        with contextlib.suppress(Exception):
            importlib.import_module(_backend)
# Transformers imports these lazily, on a cell's first `generate`: the bundled presets' model types
# and generation's own modules, so that no cell pays for them either.
for _lazy in (*(f"transformers.models.{t}.modeling_{t}" for t in PRESET_MODEL_TYPES), "transformers.generation.utils"):
    with contextlib.suppress(Exception):
        importlib.import_module(_lazy)


def cuda_state() -> dict[str, bool]:
    """Whether this process has initialised CUDA: torch's flag, and the driver library in its memory map."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    return {"cuda_initialized": torch.cuda.is_initialized(), "libcuda_mapped": "libcuda.so" in maps}


# A cell must not keep the template's `NVML_CHECK`: a GPU NVML counts may be one CUDA cannot start (a driver older
# than the torch build), failing later, less clearly. torch reads it at each call (`_nvml_based_avail`).
def forked_main(conn: Any, payload: bytes | dict[str, Any]) -> None:
    os.environ.pop(NVML_CHECK, None)  # first: before anything here can ask torch about CUDA
    try:
        answer(conn, payload)
    except BaseException as exc:  # not even the error result could be built or sent: say why, minimally
        with contextlib.suppress(BaseException):
            conn.send(no_result("the cell's result could not be built or sent", exc))
    # Done: leave now, without multiprocessing's exit work (finalizers, joining threads torch started),
    # so the cell's memory is free before the next cell starts.
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def answer(conn: Any, payload: bytes | dict[str, Any]) -> None:
    """Read the envelope (the cell's request, and what this process must become), run the cell (or the
    template's probe) and send what came of it."""
    timeline = {"imported_at": time.time()}  # nothing to import: the template did
    envelope: dict[str, Any] = {}
    found: dict[str, Any] = {}  # what this process found before the cell ran, for its environment
    try:
        envelope = pickle.loads(payload) if isinstance(payload, bytes) else payload  # cloudpickled by the actor
        if envelope.get("probe"):
            preloaded = process_started_at() > PRELOADED_AT  # imported before this process was forked
            conn.send({**cuda_state(), "forkserver_pid": os.getppid(), "preloaded": preloaded})
            return
        take_on_machine_view(envelope["env"], envelope.get("cpus"))
        watch_owner(envelope["owner_pid"])
        if envelope["request"].protocol.device == "cuda":  # before the cell reads its GPUs through NVML
            found["nvml"] = restart_nvml()
        gate = GatedRun(envelope.get("gate_path", ""), timeline)  # the measured phase holds it (see `cell/actor.py`)
        result = gate.run(envelope["request"])
    except BaseException as exc:  # anything at all: the actor must hear why, not just an exit code
        result = failed_result(envelope, exc)
    send_result(conn, result, envelope, timeline, found)


def send_result(
    conn: Any,
    result: dict[str, Any],
    envelope: dict[str, Any],
    timeline: dict[str, float],
    found: dict[str, Any] | None = None,
) -> None:
    """Send the cell's result (with this process's pid, timeline and what it `found` before the cell ran);
    one that cannot be sent is replaced by the error saying why."""
    try:
        conn.send(_stamped(result, timeline, found or {}))
    except BaseException as exc:  # e.g. a stand-in runner's result that does not pickle
        conn.send(_stamped(failed_result(envelope, exc), timeline, found or {}))


def _stamped(result: dict[str, Any], timeline: dict[str, float], found: dict[str, Any]) -> dict[str, Any]:
    if "environment" in result:  # not in a `no_result` answer
        result["environment"].update(found)
        result["environment"]["forked"] = {"pid": os.getpid(), "timeline": timeline}
    return result


def failed_result(envelope: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """The cell's `error` result for an exception outside `run_cell` (its message and traceback).

    Nothing here touches torch: after a sticky CUDA error every CUDA call raises again, and this is
    what reports it. When not even the cell can be read from the envelope, there is no result to
    build: the answer is `no_result`'s, which the actor reports as the cell's error.
    """
    try:
        cell, cid = envelope["request"].cell, envelope["request"].cell_id
    except Exception:
        return no_result("the cell's request could not be read", exc)
    result = CellResult(cid, cell, ERROR)
    record_failure(result, ERROR, exc, release_device_memory=lambda: None)  # the process ends next anyway
    return result.to_dict()


def no_result(why: str, exc: BaseException) -> dict[str, str]:
    """The answer that stands in for a result (`{NO_RESULT: message}`), built by steps that cannot fail;
    when `exc` was raised while reporting another exception (the cell's own), that one is named too."""
    text = _described(exc)
    if exc.__context__ is not None:
        text += f" (while reporting {_described(exc.__context__)})"
    return {NO_RESULT: f"{why}: {text}"[:MAX_ERROR_CHARS]}


def _described(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:  # an exception whose message itself raises
        return f"{type(exc).__name__} (its message could not be read)"


def take_on_machine_view(env: dict[str, str | None], cpus: list[int] | None) -> None:
    """Become what a fresh process in the cell's actor would be: its environment, CPUs and threads.

    The thread pool size of a fresh process comes from `OMP_NUM_THREADS` read when torch loads (else
    every allowed core); this process loaded torch in the template, so it is set again here.
    """
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if cpus:
        os.sched_setaffinity(0, cpus)
    omp = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(omp) if omp.isdigit() and int(omp) > 0 else len(os.sched_getaffinity(0)))


def watch_owner(pid: int) -> None:
    """Die with the cell's actor: when Ray kills it (timeout, Ctrl-C), this process must not go on."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)
            import select

            select.select([fd], [], [])  # readable once the process has exited
        except (OSError, AttributeError):
            while pid_alive(pid):
                time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="kvsweep-owner-watch", daemon=True).start()
