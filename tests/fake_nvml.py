"""A stand-in for the NVML bindings (`pynvml`): the calls kvsweep makes, on GPUs described by hand.

It keeps NVML's reference count as the library does: `nvmlInit` starts NVML only when nobody holds it
(`inits` counts real starts, `started_by` says which process's state is live), `nvmlShutdown` stops it
when the last holder leaves and is an `Uninitialized` error when nobody holds it. Errors are
`NVMLError` subclasses named as pynvml names them, so reasons read as they would on a GPU host.
"""

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_Uninitialized(NVMLError):  # pynvml's names
    def __str__(self) -> str:
        return "Uninitialized"


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_NotFound(NVMLError):
    def __str__(self) -> str:
        return "Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self) -> str:
        return "Driver Not Loaded"


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str = "00000000:18:00.0"  # as NVML writes it: an 8-digit domain, capitals
    energy_mj: int | None = 1_000_000  # None: no energy counter (older than Volta)
    pids: list[int] = field(default_factory=list)


class FakeNvml:
    """NVML over `gpus` (NVML's index: their position). `held`: inits nobody shut down, made by
    `started_by` (a forkserver's, inherited by a forked process); `starts=False`: NVML cannot start."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], held: int = 0, started_by: str = "", starts: bool = True) -> None:
        self.gpus, self.held, self.started_by, self.starts = gpus, held, started_by, starts
        self.inits = 0

    def nvmlInit(self) -> None:
        if not self.starts:
            raise NVMLError_DriverNotLoaded()
        if self.held == 0:
            self.inits += 1
            self.started_by = "this process"
        self.held += 1

    def nvmlShutdown(self) -> None:
        if self.held == 0:
            raise NVMLError_Uninitialized()
        self.held -= 1
        if self.held == 0:
            self.started_by = ""

    def _started(self) -> None:
        if self.held == 0:
            raise NVMLError_Uninitialized()

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        self._started()
        found = [gpu for gpu in self.gpus if gpu.uuid == uuid]
        if not found:
            raise NVMLError_NotFound()
        return found[0]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._started()
        if index >= len(self.gpus):
            raise NVMLError_NotFound()
        return self.gpus[index]

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        self._started()
        return SimpleNamespace(busId=gpu.bus_id.encode())  # bytes, as older pynvml returns it

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        self._started()
        if gpu.energy_mj is None:
            raise NVMLError_NotSupported()
        return gpu.energy_mj

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        self._started()
        return [SimpleNamespace(pid=pid) for pid in gpu.pids]

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        self._started()
        return []
