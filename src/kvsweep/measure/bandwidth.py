"""The device's achievable memory bandwidth, measured once per process with a copy benchmark.

Decode is memory-bound: each step reads the weights and the cache. Dividing the bytes a step reads
by its time and by this bandwidth gives the share of the physical limit a decode step reached — above
1 is a measurement bug, a few percent says the time goes elsewhere (launches, contention, dequant).
The copy runs outside every measured phase, on the threads the cell measures with.
"""

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kvsweep.units import MIB

COPY_ROUNDS = 5


@dataclass(frozen=True)
class Bandwidth:
    gbps: float  # bytes read + written per second / 1e9 (STREAM "copy" convention)
    last_level_cache_bytes: int | None  # None: unknown (then nothing can be called implausible)


@functools.cache
def device_bandwidth(device: str) -> Bandwidth:
    """Best of a few copies of a buffer well beyond the last-level cache; cached per process."""
    llc = _cuda_l2_bytes() if device == "cuda" else cpu_last_level_cache_bytes()
    floor, cap = (256 * MIB, 1024 * MIB) if device == "cuda" else (32 * MIB, 256 * MIB)
    size = min(max(4 * (llc or 0), floor), cap)
    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults and allocator warm-up are not bandwidth
    best = min(_timed_copy(dst, src, device) for _ in range(COPY_ROUNDS))
    del src, dst
    return Bandwidth(gbps=2 * size / best / 1e9, last_level_cache_bytes=llc)


def _timed_copy(dst: torch.Tensor, src: torch.Tensor, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def cpu_last_level_cache_bytes(cpu: int = 0) -> int | None:
    """Size of the highest cache level sysfs lists for a CPU (e.g. L3), or None."""
    best: tuple[int, int] | None = None
    for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if best is None or level > best[0]:
            best = (level, size)
    return best[1] if best else None


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def _cuda_l2_bytes() -> int | None:
    size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    return int(size) or None
