"""Which NUMA node a cell's GPUs hang off, so that its CPU slot can sit on the same socket.

A cell whose cores sit on the other socket reaches its GPU (kernel launches, an offloaded cache's copies,
sampling's reads) across the socket link. The kernel gives a PCI device's node in
`/sys/bus/pci/devices/<bus id>/numa_node` (-1: unknown, as on many one-socket nodes and VMs); the bus id comes from
NVML, which starts no CUDA, so the actor can ask before its cell's process exists (the cell asks again by UUID to
record where its GPUs really were).
"""

import contextlib
import importlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PCI_DEVICES = "/sys/bus/pci/devices"
UNKNOWN_NODE = -1


def sysfs_bus_id(bus_id: str) -> str:
    """A PCI bus id as sysfs names it (`0000:3b:00.0`): NVML writes the domain with 8 digits and capitals
    (`00000000:3B:00.0`)."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def pci_numa_node(bus_id: str | None, root: str = PCI_DEVICES) -> int:
    """The NUMA node a PCI device hangs off, or -1 when the kernel does not say (or the id is unknown)."""
    if not bus_id:
        return UNKNOWN_NODE
    try:
        return int((Path(root) / sysfs_bus_id(bus_id) / "numa_node").read_text())
    except (OSError, ValueError):
        return UNKNOWN_NODE


def nearest_node(nodes: Sequence[int]) -> int:
    """The node to put a cell's cores on: the one most of its GPUs hang off, a tie going to its first GPU's
    (it holds the embeddings and the first layers of a split model); -1 when no GPU's node is known."""
    known = [node for node in nodes if node >= 0]
    if not known:
        return UNKNOWN_NODE
    counts = Counter(known)
    return next(node for node in known if counts[node] == max(counts.values()))


def gpu_bus_ids(gpus: Sequence[str], nvml: Any = None) -> list[str | None]:
    """Each GPU's PCI bus id by NVML, None where NVML cannot say.

    A GPU is named as `CUDA_VISIBLE_DEVICES` names it: a `GPU-` UUID, found by its UUID, or an index, taken
    as NVML's (PCI order: CUDA's own order is the same on a node of identical GPUs, or with
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`); a MIG instance is not looked up. `nvml`: the bindings (`pynvml` unless
    given: the seam for tests).
    """
    try:
        nvml = nvml or importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # no pynvml, no driver
        return [None] * len(gpus)
    try:
        return [_bus_id(gpu.strip(), nvml) for gpu in gpus]
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()  # one shutdown for the init above: NVML stays as it was


def _bus_id(gpu: str, nvml: Any) -> str | None:
    try:
        if gpu.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(gpu))
        elif gpu.startswith("GPU-"):
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu)
        else:
            return None
        found = nvml.nvmlDeviceGetPciInfo(handle).busId
    except Exception:
        return None
    return found.decode() if isinstance(found, bytes) else str(found)


def gpus_numa_nodes(gpus: Sequence[str], nvml: Any = None, root: str = PCI_DEVICES) -> list[int]:
    """The NUMA node of each GPU (as `gpu_bus_ids` names them), -1 where it is not known."""
    return [pci_numa_node(bus_id, root) for bus_id in gpu_bus_ids(gpus, nvml)]


def visible_gpus_node(visible: str | None, nvml: Any = None, root: str = PCI_DEVICES) -> int:
    """The node a CPU slot should sit on for the GPUs `CUDA_VISIBLE_DEVICES` gives (Ray's assignment to the
    cell's actor): `nearest_node` of theirs; -1 with no GPU or none whose node is known."""
    gpus = [gpu for gpu in (visible or "").split(",") if gpu.strip()]
    return nearest_node(gpus_numa_nodes(gpus, nvml, root)) if gpus else UNKNOWN_NODE
