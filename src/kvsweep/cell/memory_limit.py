"""`measure.device_memory_limit_gb`: a cell runs as if its device had that many GB, failing where it would.

The failure is the allocator's own, never a verdict computed from a prediction: on CUDA torch's caching allocator
refuses past a fraction of the GPU; on a CPU the kernel refuses past a data-segment limit (`RLIMIT_DATA`, which
since Linux 4.7 counts the heap and every private writable mapping), set at what the process held at the start
plus the cell's GB. torch then raises a `RuntimeError` and Python a `MemoryError`; `cell/process.py` reads both as
OOM. The limit is lifted on the way out, whatever happened, so the process can still send its result and a
long-lived process (`ray.fork_cells=false`) keeps nothing of it.
"""

import ctypes
import re
import resource
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import torch

from kvsweep.units import GB

# at::parallel_for splits work into chunks of this many elements (torch's GRAIN_SIZE): a warm-up needs one
# chunk per thread to start them all.
GRAIN_SIZE = 32768
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt options (malloc.h)
OWN_MAPPING_BYTES = 128 * 1024  # glibc's initial mmap threshold, held fixed


@contextmanager
def memory_limit(
    device: str, limit_gb: float, gpus: int = 1, allocator: "CudaAllocator | None" = None
) -> Iterator[str | None]:
    """Limits the device's memory for the with-block; yields how (the `kvsweep.memory_limit` tag), or None
    when no limit is set. `gpus`: the CUDA devices the cell holds (0..gpus-1, all it sees), each capped."""
    if limit_gb <= 0:
        yield None
    elif device == "cuda":
        with cuda_fraction(int(limit_gb * GB), range(max(1, gpus)), allocator or TorchAllocator()) as how:
            yield how
    else:
        with data_segment_limit(int(limit_gb * GB)) as how:
            yield how


class CudaAllocator(Protocol):
    """What the CUDA cap needs of torch: each device's size, and its caching allocator's fraction. A seam: a
    split cell's every GPU is capped, which CPU tests check with an allocator that records what it was told."""

    def total_memory(self, index: int) -> int: ...

    def set_fraction(self, fraction: float, index: int) -> None: ...


class TorchAllocator:
    def total_memory(self, index: int) -> int:
        return torch.cuda.get_device_properties(index).total_memory

    def set_fraction(self, fraction: float, index: int) -> None:
        torch.cuda.set_per_process_memory_fraction(fraction, index)


@contextmanager
def cuda_fraction(limit_bytes: int, indices: Iterable[int], allocator: CudaAllocator) -> Iterator[str]:
    """The caching allocator of every GPU the cell holds capped at limit/total of that GPU (`start_device` has
    started CUDA): torch applies a fraction to one device only, and a split cell's fullest GPU is often its
    last (the head and the logits), so capping the first alone would let the cell use memory it claims not to
    have. Every cap set is lifted on the way out."""
    capped: list[int] = []
    said: list[str] = []
    try:
        for index in indices:
            total = allocator.total_memory(index)
            if limit_bytes >= total:
                said.append(f"GPU {index} not capped: {limit_bytes / GB:.2f} GB is not below its {total / GB:.1f} GB")
                continue
            allocator.set_fraction(limit_bytes / total, index)
            capped.append(index)
            said.append(f"GPU {index} fraction {limit_bytes / total:.3f} of {total / GB:.1f} GB")
        yield f"cuda limit {limit_bytes / GB:.2f} GB a GPU: " + "; ".join(said)
    finally:
        for index in capped:
            allocator.set_fraction(1.0, index)


@contextmanager
def data_segment_limit(limit_bytes: int) -> Iterator[str]:
    """The process's soft `RLIMIT_DATA` set to its data segment now plus `limit_bytes`, the old one restored
    on exit. An existing soft limit that is already tighter is kept (and said so)."""
    start_thread_pool()
    release_freed_memory()
    at_start = vm_data_bytes()
    wanted = at_start + limit_bytes
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY and soft <= wanted:
        yield (
            f"cpu data segment {limit_bytes / GB:.2f} GB past {at_start / GB:.2f} GB at start not applied: "
            f"the process's own limit of {soft / GB:.2f} GB is tighter"
        )
        return
    resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
    try:
        yield f"cpu data segment {limit_bytes / GB:.2f} GB past {at_start / GB:.2f} GB at start"
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def release_freed_memory() -> None:
    """glibc keeps freed memory for reuse, and raises its mmap threshold as large blocks are freed, so the
    data segment counts memory the cell no longer holds, more or less by chance. A fixed threshold makes
    every block past 128 KiB (a tensor) a mapping of its own, returned when freed: the limit then counts
    what the cell holds, and the same cell fails at the same size every time."""
    libc = ctypes.CDLL(None)
    for option in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD):
        libc.mallopt(option, OWN_MAPPING_BYTES)
    libc.malloc_trim(0)


def start_thread_pool() -> None:
    """Start torch's intra-op threads now, outside the limit: libgomp cannot report a thread it fails to
    create, it exits the process (the cell would crash instead of ending `oom`). Their stacks then count
    as the process's start."""
    threads = max(1, torch.get_num_threads())
    torch.ones(GRAIN_SIZE * threads * 2).add_(1)


def vm_data_bytes(status: Path = Path("/proc/self/status")) -> int:
    """The process's data segment as the kernel counts it against `RLIMIT_DATA` (VmData, in kB)."""
    found = re.search(r"^VmData:\s+(\d+) kB$", status.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{status} has no VmData line: the data-segment limit needs Linux")
    return int(found.group(1)) * 1024
