"""What a cell ran on, recorded with every result so numbers can be compared honestly."""

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
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
    }
    if device == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        env["cuda_version"] = torch.version.cuda
        env["gpu_index"] = index
        env["gpu_uuid"] = gpu_uuid(index)
    return env


def gpu_uuid(index: int) -> str:
    """NVML-style `GPU-...` id of a visible device: stable across processes, unlike its index."""
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    return uuid if not uuid or uuid.startswith("GPU-") else f"GPU-{uuid}"
