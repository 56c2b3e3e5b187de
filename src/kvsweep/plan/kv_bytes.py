"""A cell's KV bytes: the dense yardstick, what its strategy holds, and what a decode step moves.

The byte accounting itself belongs to each strategy (`caches/accounting.py`, named in the registry);
this module applies it to a cell's request. The planner's host-link time for an offloaded cache and
the cell's measured `decode_host_link_bytes_per_token` both come from `decode_kv_traffic`.
"""

from collections.abc import Callable
from dataclasses import dataclass

from kvsweep.caches import CacheStrategy, get_strategy
from kvsweep.caches.accounting import allocated_bytes, attended_bytes, dense_kv_bytes
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape


@dataclass(frozen=True)
class DecodeKvTraffic:
    """A decode step's cache bytes, averaged over the call's decode steps, by the path they take."""

    device_bytes: float  # through device memory: the cache's part of `decode_bytes_per_token`
    host_link_bytes: float  # between host and device memory, both ways (an offloaded cache; else 0)


def decode_kv_traffic(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int
) -> DecodeKvTraffic:
    """The cache bytes a decode step moves, as Transformers' cache layers move them, averaged over the
    call's decode steps 1 .. new-1 (the prefill made the first token).

    Device memory: what the strategy's entry says a step reads and writes (`decode_step_bytes`, by
    default the cache after the step's update). Host link, an offloaded cache only: `Cache.update`
    brings every layer to the device before its attention and sends the whole layer back after its
    update (kvsweep's models have no sliding layers, which would stay), so the link carries the cache
    as it was before the step and as it is after (`host_link_step_bytes`); attention still reads each
    layer from device memory, so the device figure is the dense one. Appending the new token to the
    stored cache is the cache's own update and is not counted (a dynamic layer concatenates it into a
    new tensor; a static one writes one slot).
    """
    step_bytes = strategy.decode_step_bytes or attended_bytes
    device = _mean_over_decode(lambda j: step_bytes(strategy, shape, batch, dtype, prompt, new, j), new)
    link = 0.0
    if strategy.offloading:
        link = _mean_over_decode(lambda j: host_link_step_bytes(strategy, shape, batch, dtype, prompt, new, j), new)
    return DecodeKvTraffic(device, link)


def host_link_step_bytes(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int, step: int
) -> int:
    """An offloaded cache's decode step `step` (1 ..) over the host link: every layer to the device as it
    was before the step, and back as it is after (a static layout: its full allocation both ways)."""
    return allocated_bytes(strategy, shape, batch, dtype, prompt, new, step - 1) + allocated_bytes(
        strategy, shape, batch, dtype, prompt, new, step
    )


def _mean_over_decode(per_step: Callable[[int], float], new: int) -> float:
    """Mean over a call's decode steps 1 .. new-1 (the prefill made the first token); 0 without any."""
    steps = range(1, new)
    return sum(per_step(j) for j in steps) / len(steps) if steps else 0.0


def cell_dense_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """The contract's `kv_cache_bytes_dense` for a cell: every cached token in the model's dtype."""
    return dense_kv_bytes(shape, cell.cached_tokens, cell.batch_size, cell.dtype)


def cell_stored_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """What the cell's cache holds when `generate` returns (its measured `kv_cache_bytes`)."""
    strategy = get_strategy(cell.cache)
    return strategy.held_bytes(shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens - 1)
