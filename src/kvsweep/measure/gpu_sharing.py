"""Who else is on this cell's GPUs? Shared clusters put other people's jobs beside ours.

Processes are read through NVML, each GPU matched by UUID (indices differ between processes and containers);
without NVML the answer is "unknown", quietly. The probe runs only once the cell holds a CUDA context on each of
its GPUs, so our own process must be in each GPU's list:

- In a container NVML reports host PIDs: when our PID is not in a non-empty list, the lowest PID is taken to be
  us (they cannot be told apart; the others count as someone else).
- An empty list means NVML cannot show this process at all (an unmappable PID namespace, a MIG instance, a driver
  hiding other containers): whoever else is there is hidden as well, so "unknown", never "alone".
"""

import importlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ProcessLister = Callable[[str], list[int] | None]
UNKNOWN, CONTENDED, ALONE = "unknown", "true", "false"


def nvml_processes(gpu_uuid: str, nvml: Any = None) -> list[int] | None:
    """PIDs with a context on the GPU, or None when NVML cannot say. `nvml`: the bindings (`pynvml`
    unless given: the seam for tests)."""
    try:
        nvml = nvml or importlib.import_module("pynvml")
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        procs = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        procs += list(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
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


@dataclass(frozen=True)
class GpuSharing:
    """What the checks of the cell's GPUs found: each GPU's other processes, and the GPUs a check could not
    read. A cell is contended if any check saw another process on any of them.

    `gpu_uuids`: the cell's GPUs in its device order (none: not on CUDA, the verdict is unknown).
    """

    gpu_uuids: tuple[str, ...] = ()
    seen_on: dict[str, frozenset[int]] = field(default_factory=dict)
    blind_on: frozenset[str] = frozenset()

    @property
    def seen(self) -> set[int]:
        """Every other process seen, on any of the GPUs."""
        return {pid for pids in self.seen_on.values() for pid in pids}

    @property
    def known(self) -> bool:
        return bool(self.gpu_uuids) and not self.blind_on

    def state_of(self, uuid: str) -> str:
        if self.seen_on.get(uuid):
            return CONTENDED
        return UNKNOWN if uuid in self.blind_on or uuid not in self.seen_on else ALONE

    @property
    def verdict(self) -> str:
        if self.seen:
            return CONTENDED
        return ALONE if self.known else UNKNOWN

    def record(self) -> dict[str, str]:
        """The environment's account: other processes seen (`gpu_other_pids`, as ever) and, per GPU, what its
        checks found (`gpu_sharing`: `GPU-a alone, GPU-b pids 77`); nothing off CUDA."""
        if not self.gpu_uuids:
            return {}
        record = {"gpu_sharing": ", ".join(f"{uuid} {self._found_on(uuid)}" for uuid in self.gpu_uuids)}
        if self.seen:
            record["gpu_other_pids"] = ",".join(map(str, sorted(self.seen)))
        return record

    def _found_on(self, uuid: str) -> str:
        state = self.state_of(uuid)
        if state == CONTENDED:
            return "pids " + ",".join(map(str, sorted(self.seen_on[uuid])))
        return "alone" if state == ALONE else "unknown"


@dataclass
class SharingProbe:
    """The phase meter of the cell's GPUs (`Meter[GpuSharing]`): `start` waits up to `wait_for_idle_s` for
    other processes to leave, then checks each GPU; `stop` checks again and returns what every check found.

    `gpu_uuids`: the cell's GPUs in its device order (none: not on CUDA, the verdict is unknown).
    Ask only while this process holds a CUDA context on every one (see the module docstring).
    """

    gpu_uuids: Sequence[str]
    lister: ProcessLister = nvml_processes
    own_pid: int = field(default_factory=os.getpid)
    wait_for_idle_s: float = 0.0
    seen_on: dict[str, set[int]] = field(init=False)  # each GPU's other processes seen so far
    blind_on: set[str] = field(init=False, default_factory=set)  # GPUs a check could not read

    def __post_init__(self) -> None:
        self.gpu_uuids = tuple(self.gpu_uuids)
        self.seen_on = {uuid: set() for uuid in self.gpu_uuids}

    def start(self) -> None:
        self.wait_until_alone(self.wait_for_idle_s)
        self.check()

    def stop(self) -> GpuSharing:
        self.check()
        return self.found()

    def found(self) -> GpuSharing:
        """What the checks so far found."""
        seen_on = {uuid: frozenset(pids) for uuid, pids in self.seen_on.items()}
        return GpuSharing(tuple(self.gpu_uuids), seen_on, frozenset(self.blind_on))

    def _others(self) -> dict[str, list[int] | None]:
        found = {}
        for uuid in self.gpu_uuids:
            pids = self.lister(uuid)
            found[uuid] = None if pids is None else others(pids, self.own_pid)
        return found

    def check(self) -> list[int] | None:
        """Other processes seen now on any of the GPUs, or None when a GPU could not be read this time
        (the verdict becomes unknown unless another process is seen)."""
        found = self._others()
        for uuid, pids in found.items():
            if pids is None:
                self.blind_on.add(uuid)
            else:
                self.seen_on[uuid].update(pids)
        if any(pids is None for pids in found.values()):
            return None
        return sorted({pid for pids in found.values() for pid in pids or ()})

    def wait_until_alone(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Wait (up to timeout_s) for other processes to leave the GPUs before measuring; no wait for a GPU
        whose processes NVML cannot tell."""
        deadline = time.monotonic() + timeout_s
        while timeout_s > 0:
            if not any(self._others().values()) or time.monotonic() >= deadline:
                return
            time.sleep(poll_s)
