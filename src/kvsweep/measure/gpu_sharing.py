"""Who else is on this cell's GPU? Shared clusters put other people's jobs beside ours.

Processes are read through NVML and the GPU is matched by UUID (indices differ between processes
and containers). Without NVML (CPU, no driver) the answer is "unknown", quietly.

The probe is asked only once the cell holds a CUDA context on that GPU (its model is loaded), so our
own process must be in the list. Two things follow:

- In a container NVML reports host PIDs: when our own PID is not in a non-empty list, one of the
  processes is taken to be us (the one with the lowest PID, which cannot be told apart; the others
  count as someone else).
- An empty list means NVML cannot show this process at all (a PID namespace it cannot map, a MIG
  instance, a driver that hides other containers' processes): whoever else is there is hidden just
  as well, so the answer is "unknown", never "alone".
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


def others(pids: list[int], own_pid: int) -> list[int] | None:
    """The processes on the GPU besides ours, or None when the list cannot include ours (it is empty)."""
    if not pids:
        return None  # we hold a context, so NVML is not showing us: it may hide anyone
    if own_pid in pids:
        return [p for p in pids if p != own_pid]
    return sorted(pids)[1:]  # PID namespace: one of them is us


@dataclass
class SharingProbe:
    """Checks before and after the measured phase; a cell is contended if any check saw another process.

    Ask only while this process holds a CUDA context on the GPU (see the module docstring).
    """

    gpu_uuid: str | None
    lister: ProcessLister = nvml_processes
    own_pid: int = field(default_factory=os.getpid)
    seen: set[int] = field(default_factory=set)
    known: bool = True

    def _others(self) -> list[int] | None:
        pids = self.lister(self.gpu_uuid) if self.gpu_uuid else None
        return None if pids is None else others(pids, self.own_pid)

    def check(self) -> list[int] | None:
        """Other processes seen now, or None when this check could not tell (the verdict becomes unknown)."""
        found = self._others()
        if found is None:
            self.known = False
            return None
        self.seen.update(found)
        return found

    def wait_until_alone(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Wait (up to timeout_s) for other processes to leave the GPU before measuring; no wait when
        NVML cannot tell."""
        deadline = time.monotonic() + timeout_s
        while timeout_s > 0:
            found = self._others()
            if not found or time.monotonic() >= deadline:
                return
            time.sleep(poll_s)

    @property
    def verdict(self) -> str:
        if self.seen:
            return CONTENDED
        return ALONE if self.known and self.gpu_uuid else UNKNOWN
