"""What a cell ran on, recorded with every result so numbers can be compared honestly.

The host's part needs no device and is found first; then the cell starts its device, and only then
is the device described. A cell whose CUDA cannot start still reports which host, torch build and
CUDA version it tried, with the reason CUDA gave.
"""

import os
import platform
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

import kvsweep
from kvsweep.cell.cpu_slots import read_places
from kvsweep.cell.gpu_numa import gpus_numa_nodes


class CudaStartError(Exception):
    """CUDA could not start in the cell's process (a driver older than the torch build, no device).

    Not a `RuntimeError`: a driver that answers "out of memory" while starting is not the cell's OOM.
    """


def start_device(device: str, cuda_init: Callable[[], None] | None = None) -> None:
    """Initialise CUDA now, before anything asks about it, so that a CUDA that cannot start fails here
    with its own reason (`torch.cuda.init` raises it; `is_available` would only say False).

    `cuda_init` replaces `torch.cuda.init` (a test seam: the `cuda_init` fault) and runs on any
    device, so the failure can be seen on a host without a GPU.
    """
    if cuda_init is None and device != "cuda":
        return
    try:
        (cuda_init or torch.cuda.init)()
    except Exception as exc:
        raise CudaStartError(f"CUDA could not start in the cell's process: {type(exc).__name__}: {exc}") from exc


def describe_host(device: str) -> dict[str, Any]:
    """What the cell's process found before touching its device: nothing here initialises CUDA.

    `cpus_numa_nodes`: the NUMA nodes of the cores it may run on (its CPU slot's, on CUDA), to set beside
    its GPUs' `gpu_numa_nodes`.
    """
    env: dict[str, Any] = {
        "torch_version": str(torch.__version__),  # a plain str: a TorchVersion would import torch to unpickle
        "transformers_version": str(transformers.__version__),
        "kvsweep_version": kvsweep.__version__,
        "torch_threads": torch.get_num_threads(),
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),  # Ray's default 15 would measure at low priority
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "cpus_numa_nodes": ",".join(map(str, sorted({p.node for p in read_places(sorted(os.sched_getaffinity(0)))}))),
    }
    if device == "cuda":
        env["cuda_version"] = torch.version.cuda  # the build's CUDA, which the driver must support
    return env


def describe_device(device: str, gpus: int = 1) -> dict[str, Any]:
    """The device the cell measures on (on CUDA, once `start_device` has started it).

    On CUDA, each of the cell's `gpus` GPUs: `gpu_uuids` and `gpu_numa_nodes` (-1: unknown), comma-separated in
    device order; `gpu_index` and `gpu_uuid` are the first's, as before cells spanned GPUs.
    """
    env: dict[str, Any] = {"device_name": device_name(device), "device_total_mem_bytes": device_total_bytes(device)}
    if device == "cuda" and torch.cuda.is_available():
        indices = cell_gpu_indices(gpus)
        uuids = [gpu_uuid(index) for index in indices]
        env["gpu_index"] = indices[0]
        env["gpu_uuid"] = uuids[0]
        env["gpu_uuids"] = ",".join(uuids)
        env["gpu_numa_nodes"] = ",".join(map(str, gpus_numa_nodes(uuids)))
        env["driver_version"] = driver_version()
    return env


def cell_gpu_indices(gpus: int) -> list[int]:
    """The cell's GPUs by this process's index: the current device alone, or the first `gpus` visible ones
    (as `cell_devices` places a model over them; at most as many as are visible)."""
    if gpus <= 1:
        return [torch.cuda.current_device()]
    return list(range(max(1, min(gpus, torch.cuda.device_count()))))


def recorded_gpu_uuids(environment: dict[str, Any]) -> tuple[str, ...]:
    """The cell's GPUs as `describe_device` recorded them (none off CUDA), for NVML's probes and counters."""
    return tuple(uuid for uuid in str(environment.get("gpu_uuids", "")).split(",") if uuid)


def driver_version() -> str:
    """The NVIDIA driver (`550.54.15`) from NVML; without pynvml, the CUDA version the driver supports
    as torch reads it (`cuda 12.4`). An upgraded driver is the first suspect when a GPU sweep slows."""
    try:
        import pynvml

        pynvml.nvmlInit()
        found = pynvml.nvmlSystemGetDriverVersion()
        return found.decode() if isinstance(found, bytes) else str(found)
    except Exception:  # no pynvml, or NVML cannot start: fall back to what the CUDA runtime reports
        api = int(torch._C._cuda_getDriverVersion())
        return f"cuda {api // 1000}.{api % 1000 // 10}"


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def device_total_bytes(device: str) -> int:
    """The capacity a cell's peak memory is drawn against: the GPU's memory, else the host's RAM."""
    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_uuid(index: int) -> str:
    """NVML-style `GPU-...` id of a visible device: stable across processes, unlike its index."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    return uuid if not uuid or uuid.startswith("GPU-") else f"GPU-{uuid}"
