"""What an offloaded cache costs the host: pinned memory, and a round trip over the host link per token.

Transformers' offloaded caches keep a layer or two on the device and the rest in pinned host
memory; every decode step brings each layer to the device and sends it back, whole. At long
context that is the cache's size twice per token (Llama-3.1-8B, 131k tokens, batch 4: about 137 GB
per token, seconds over PCIe), enough for a cell to run into its timeout and be retried for
nothing. CUDA's host allocator rounds each pinned block up to a power of two, so just above one
the host holds nearly twice the cache. The planner skips such cells with the reason, before they run.
"""

import os
from dataclasses import dataclass

from kvsweep.caches import CacheStrategy
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape
from kvsweep.plan.kv_bytes import cell_stored_kv_bytes, mean_decode_kv_bytes

GB = 1e9


@dataclass(frozen=True)
class OffloadEstimate:
    host_bytes: int  # pinned host memory of the offloaded layers, blocks rounded up to powers of two
    moved_bytes_per_token: float  # to the device and back, every layer, averaged over the decode
    seconds_per_token: float  # at the configured host link speed
    cell_seconds: float  # transfers of every call the cell makes (cold, warmup, repeats, quality)


@dataclass(frozen=True)
class HostLimits:
    """What bounds an offloaded cell on a GPU node: its host memory, link speed, the cell's time and calls."""

    memory_bytes: int | None
    link_gbps: float
    timeout_s: float
    calls: int  # generate calls a cell makes: cold, warmup, repeats, quality


def host_limits(planner_memory_gb: float, link_gbps: float, timeout_s: float, warmup: int, repeats: int) -> HostLimits:
    """The configured host memory, else this machine's (the driver usually runs on a node like the others)."""
    memory = int(planner_memory_gb * GB) if planner_memory_gb > 0 else physical_memory_bytes()
    return HostLimits(memory, link_gbps, timeout_s, calls=1 + warmup + repeats + 1)


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def estimate_offload(
    cell: Cell, strategy: CacheStrategy, shape: KvShape, link_gbps: float, calls: int
) -> OffloadEstimate | None:
    """None for a cache that does not offload."""
    if strategy.device_layers is None:
        return None
    stored = cell_stored_kv_bytes(cell, shape)
    layers = max(shape.layers, 1)
    tensor = stored // (2 * layers)  # one layer's keys, or its values
    host_layers = max(layers - strategy.device_layers, 0)
    host = 2 * host_layers * next_power_of_two(tensor)
    mean = mean_decode_kv_bytes(strategy, shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens)
    moved = 2 * mean  # there and back
    per_token = moved / (link_gbps * GB)
    return OffloadEstimate(host, moved, per_token, calls * cell.max_new_tokens * per_token)


def offload_problem(estimate: OffloadEstimate, timeout_s: float, host_memory_bytes: int | None) -> str | None:
    """Why an offloaded cell cannot finish here, or None."""
    if host_memory_bytes and estimate.host_bytes > host_memory_bytes:
        return (
            f"predicted host oom: offloaded layers need {estimate.host_bytes / GB:.1f} GB of pinned host memory "
            f"(blocks round up to powers of two) of {host_memory_bytes / GB:.1f} GB"
        )
    if timeout_s > 0 and estimate.cell_seconds > timeout_s:
        return (
            f"predicted timeout: {estimate.moved_bytes_per_token / GB:.1f} GB to the device and back per token "
            f"({estimate.seconds_per_token:.2f} s at planner.host_link_gbps) makes {estimate.cell_seconds:.0f} s "
            f"over the cell's calls, beyond ray.cell_timeout_s={timeout_s:g}; shorten the context or raise the timeout"
        )
    return None
