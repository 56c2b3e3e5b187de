"""Who else is on this cell's GPU? Shared clusters put other people's jobs beside ours.

Processes are read through NVML and the GPU is matched by UUID (indices differ between processes
and containers). Without NVML (CPU, no driver) the answer is "unknown", quietly. In a container
NVML reports host PIDs, so when our own PID is not in the list, one process is taken to be us.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ProcessLister = Callable[[str], list[int] | None]
UNKNOWN, CONTENDED, ALONE = "unknown", "true", "false"


def nvml_processes(gpu_uuid: str) -> list[int] | None:
    """PIDs with a context on the GPU, or None when NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        procs += list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
        return sorted({p.pid for p in procs})
    except Exception:
        return None


def others(pids: list[int], own_pid: int) -> list[int]:
    if own_pid in pids:
        return [p for p in pids if p != own_pid]
    return sorted(pids)[1:] if pids else []  # PID namespace: one of them is us


@dataclass
class SharingProbe:
    """Checks before and after the measured phase; a cell is contended if any check saw another process."""

    gpu_uuid: str | None
    lister: ProcessLister = nvml_processes
    own_pid: int = field(default_factory=os.getpid)
    seen: set[int] = field(default_factory=set)
    known: bool = True

    def check(self) -> list[int] | None:
        pids = self.lister(self.gpu_uuid) if self.gpu_uuid else None
        if pids is None:
            self.known = False
            return None
        found = others(pids, self.own_pid)
        self.seen.update(found)
        return found

    def wait_until_alone(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Wait (up to timeout_s) for other processes to leave the GPU before measuring."""
        deadline = time.monotonic() + timeout_s
        while timeout_s > 0:
            found = self.lister(self.gpu_uuid) if self.gpu_uuid else None
            if found is None or not others(found, self.own_pid) or time.monotonic() >= deadline:
                return
            time.sleep(poll_s)

    @property
    def verdict(self) -> str:
        if self.seen:
            return CONTENDED
        return ALONE if self.known and self.gpu_uuid else UNKNOWN
