"""What a cell knows of its own process, each a small rule tested without Ray or a GPU.

Whether a process was killed for host memory, when it started, and the host's preparation gate (`host_gate`,
`GatedRun`: a file lock per Ray session and host, held exclusively by whatever prepares and shared by a measured
phase, so nothing heavy starts on a CPU host while a cell there is measured). A forked cell that died by SIGKILL is
a host OOM when its cgroup's `oom_kill` counter rose meanwhile (v2 `memory.events`, v1 `memory.oom_control`). NVML
does not survive a fork and the template's forkserver initialised it, so a forked cell shuts it down and starts it
afresh (`restart_nvml`).
"""

import contextlib
import fcntl
import importlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

NO_RESULT = "no_result"  # a forked process's answer without a result: {NO_RESULT: why}
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # torch's switch: device checks by NVML, no CUDA started
CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2
            count = _field(root / relative / "memory.events", "oom_kill")
        elif "memory" in controllers.split(","):
            count = _field(root / "memory" / relative / "memory.oom_control", "oom_kill")
        else:
            continue
        if count is not None:
            return count
    return None


def _field(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def process_started_at() -> float:
    """Wall-clock start of this process from /proc (psutil's create_time is only good to a second)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


RESTARTED = "restarted"
FAILED = "failed to start"
MOST_SHUTDOWNS = 64  # far more inits than the forkserver makes; beyond it, something else holds NVML


def restart_nvml(nvml: Any = None) -> str:
    """`RESTARTED`, or `failed to start: why`. `nvml`: the bindings (`pynvml` unless given: the seam for tests)."""
    try:
        nvml = nvml or importlib.import_module("pynvml")
    except ImportError:
        return f"{FAILED}: pynvml is not installed"
    try:
        nvml.nvmlInit()  # loads the library into pynvml (torch loaded it apart), one more user of the old state
    except nvml.NVMLError as exc:
        return f"{FAILED}: {type(exc).__name__}: {exc}"
    for _ in range(MOST_SHUTDOWNS):
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:  # not initialised any more: the inherited state is gone
            break
    else:
        return f"{FAILED}: NVML was still initialised after {MOST_SHUTDOWNS} shutdowns"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"{FAILED}: {type(exc).__name__}: {exc}"
    return RESTARTED


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
