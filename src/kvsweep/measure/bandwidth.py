"""The device's achievable memory bandwidth, measured once per process with a copy benchmark.

Decode is memory-bound: each step reads the weights and the cache, so bytes read / step time / this bandwidth is
the share of the physical limit a step reached (above 1 is a measurement bug; a few percent says the time goes
elsewhere). The copy runs outside every measured phase, on the threads the cell measures with. On CUDA one
256 MiB copy takes about 130 µs and a launch plus a host sync 10-20 µs, so a single copy between syncs reads about
10% low: a reading is several back-to-back copies between two CUDA events. A CPU copy of tens of MiB takes
milliseconds and returns when done, so one copy per host-clock reading is exact.
"""

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from kvsweep.models.quantize_weights import stored_bytes
from kvsweep.names import Metric
from kvsweep.units import MIB

COPY_ROUNDS = 5  # readings; the best one counts (noise only ever slows a copy down)


@dataclass(frozen=True)
class Bandwidth:
    gbps: float  # bytes read + written per second / 1e9 (STREAM "copy" convention)
    last_level_cache_bytes: int | None  # None: unknown (then nothing can be called implausible)


class Stopwatch(Protocol):
    """Times the work queued between `start` and `stop` (seconds), however the device runs it."""

    def start(self) -> None: ...

    def stop(self) -> float: ...


class HostClock:
    """The host's clock: right for work that returns when it is done (a CPU copy)."""

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self._started


class CudaEvents:
    """Two CUDA events on the current stream: the device's time between them, without the host's launch and sync."""

    def __init__(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._start.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3  # elapsed_time is in milliseconds


@dataclass(frozen=True)
class CopyPlan:
    """How one device's copy benchmark runs: buffer size bounds, copies per reading, and its clock."""

    floor_bytes: int
    cap_bytes: int
    copies_per_reading: int
    stopwatch: Callable[[], Stopwatch]


COPY_PLANS: dict[str, CopyPlan] = {
    # 16 x ~130 µs per reading: the one launch the events can still see is a fraction of a percent
    "cuda": CopyPlan(256 * MIB, 1024 * MIB, copies_per_reading=16, stopwatch=CudaEvents),
    "cpu": CopyPlan(32 * MIB, 256 * MIB, copies_per_reading=1, stopwatch=HostClock),
}


@functools.cache
def device_bandwidth(device: str) -> Bandwidth:
    """Best of a few readings of copies of a buffer well beyond the last-level cache; cached per process."""
    llc = _cuda_l2_bytes() if device == "cuda" else cpu_last_level_cache_bytes()
    plan = COPY_PLANS[device]
    size = min(max(4 * (llc or 0), plan.floor_bytes), plan.cap_bytes)
    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy = functools.partial(dst.copy_, src)
    gbps = copy_bandwidth_gbps(copy, size, plan.stopwatch(), copies=plan.copies_per_reading, rounds=COPY_ROUNDS)
    del src, dst, copy
    return Bandwidth(gbps=gbps, last_level_cache_bytes=llc)


def copy_bandwidth_gbps(
    copy: Callable[[], object], bytes_per_copy: int, stopwatch: Stopwatch, copies: int, rounds: int
) -> float:
    """Bytes read + written per second / 1e9 by `copies` back-to-back copies per reading, best of `rounds`.

    One untimed copy first: page faults and allocator warm-up are not bandwidth.
    """
    copy()
    best = float("inf")
    for _ in range(rounds):
        stopwatch.start()
        for _ in range(copies):
            copy()
        best = min(best, stopwatch.stop())
    return 2 * bytes_per_copy * copies / best / 1e9


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


MAX_UTILIZATION = 1.05
FROM_MEMORY_FACTOR = 4


def decode_weight_bytes(model: Any) -> int:
    """Weight bytes a decode step reads: every matrix once, as stored, but only a few rows of an untied
    input embedding (a lookup, not a read of the whole table).

    As stored, not `numel() * element_size()`: a quantized weight (quanto's int8/int4, torchao's int4) is a
    tensor subclass that keeps its original shape and the dtype of its scales, so its nominal size is 2-8x
    what memory holds and a decode step reads. `stored_bytes` counts the storages beneath (payload, scales,
    shifts; bitsandbytes' quant state), and the persistent buffers a pre-quantized checkpoint keeps its
    packed weights in; tied weights count once."""
    embedding_module = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and _same_storage(output.weight, embedding_module.weight)
    total = stored_bytes(model)
    return total if tied else total - stored_bytes(embedding_module)


def _same_storage(a: Any, b: Any) -> bool:
    """Tied: one tensor, or two views of one storage (a quantized subclass may have no storage of its own)."""
    if a is b:
        return True
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def bandwidth_metrics(
    bytes_per_token: float, tpot_ms: float, bandwidth: Bandwidth, host_link_bytes_per_token: float = 0.0
) -> dict[str, float]:
    """`decode_bytes_per_token`, `decode_host_link_bytes_per_token`, `mem_bandwidth_gbps` and
    `decode_bandwidth_utilization`.

    Utilization divides device-memory bytes by device-memory bandwidth only: what crosses the host link
    (an offloaded cache's layers) is reported beside it, never mixed into it.
    """
    metrics = {
        Metric.DECODE_BYTES_PER_TOKEN: float(bytes_per_token),
        Metric.DECODE_HOST_LINK_BYTES_PER_TOKEN: float(host_link_bytes_per_token),
        Metric.MEM_BANDWIDTH_GBPS: bandwidth.gbps,
    }
    if tpot_ms > 0 and bandwidth.gbps > 0:
        metrics[Metric.DECODE_BANDWIDTH_UTILIZATION] = bytes_per_token / (tpot_ms / 1e3) / (bandwidth.gbps * 1e9)
    return metrics


def implausible(metrics: dict[str, float], bandwidth: Bandwidth) -> bool:
    """True when decode moved more bytes per second than the device can, for bytes no cache could hold."""
    utilization = metrics.get(Metric.DECODE_BANDWIDTH_UTILIZATION)
    llc = bandwidth.last_level_cache_bytes
    if utilization is None or llc is None:
        return False
    return utilization > MAX_UTILIZATION and metrics[Metric.DECODE_BYTES_PER_TOKEN] > FROM_MEMORY_FACTOR * llc
