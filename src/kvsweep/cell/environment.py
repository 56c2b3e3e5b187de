"""What a cell ran on, recorded with every result so numbers can be compared honestly."""

import os
import platform
import socket
from pathlib import Path
from typing import Any

import torch
import transformers


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


def describe_environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device_name": device_name(device),
        "torch_version": str(torch.__version__),  # a plain str: a TorchVersion would import torch to unpickle
        "transformers_version": str(transformers.__version__),
        "torch_threads": torch.get_num_threads(),
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),  # Ray's default 15 would measure at low priority
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "device_total_mem_bytes": device_total_bytes(device),
    }
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        env["cuda_version"] = torch.version.cuda
        env["gpu_index"] = index
        env["gpu_uuid"] = gpu_uuid(index)
    return env


def device_total_bytes(device: str) -> int:
    """The capacity a cell's peak memory is drawn against: the GPU's memory, else the host's RAM."""
    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_uuid(index: int) -> str:
    """NVML-style `GPU-...` id of a visible device: stable across processes, unlike its index."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    return uuid if not uuid or uuid.startswith("GPU-") else f"GPU-{uuid}"
