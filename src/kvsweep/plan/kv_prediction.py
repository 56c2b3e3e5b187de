"""A cell's KV bytes: the dense yardstick, what its strategy holds, and what a decode step moves.

The byte accounting itself belongs to each strategy (`caches/accounting.py`, named in the registry);
this module applies it to a cell's request. The planner's host-link time for an offloaded cache and
the cell's measured `decode_host_link_bytes_per_token` both come from `decode_kv_traffic`.
"""

from collections.abc import Callable
from dataclasses import dataclass

from kvsweep.caches import CacheStrategy, get_strategy
from kvsweep.caches.accounting import attended_bytes, dense_kv_bytes
from kvsweep.caches.layer_tokens import device_kv_bytes, offloaded_kv_bytes, returned_device_kv_bytes, state_bytes
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

    Device memory: what the strategy's entry says a step reads and writes (`decode_step_bytes`). Host link, an
    offloaded cache only: `Cache.update` brings every offloaded layer (`layer_tokens.offloads`) to the device
    before its attention and sends it back whole after its update, so the link carries those layers as before and
    after the step (`host_link_step_bytes`); attention still reads device memory, so the device figure is the
    dense one. Appending the new token is the cache's own update and is not counted.
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
    """An offloaded cache's decode step `step` (1 ..) over the host link: every offloaded layer to the device
    as it was before the step, and back as it is after (a static layout: its full allocation both ways)."""
    return offloaded_allocation(strategy, shape, batch, dtype, prompt, new, step - 1) + offloaded_allocation(
        strategy, shape, batch, dtype, prompt, new, step
    )


def offloaded_allocation(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int, decoded: int
) -> int:
    """The offloaded layers' bytes after `decoded` decode steps of a call making `new` tokens (a static layout
    at its full length from the start, `CacheStrategy.allocated_steps`)."""
    return offloaded_kv_bytes(strategy, shape, batch, dtype, prompt, strategy.allocated_steps(new, decoded))


def _mean_over_decode(per_step: Callable[[int], float], new: int) -> float:
    """Mean over a call's decode steps 1 .. new-1 (the prefill made the first token); 0 without any."""
    steps = range(1, new)
    return sum(per_step(j) for j in steps) / len(steps) if steps else 0.0


def cell_dense_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """The contract's `kv_cache_bytes_dense` for a cell: the tokens each layer keeps of every cached token (a
    sliding or chunked layer: at most its window), in the model's dtype, and any state layers' states."""
    tokens = cell.cached_tokens
    return dense_kv_bytes(shape, tokens, cell.batch_size, cell.dtype) + state_bytes(shape, cell.batch_size, cell.dtype)


def cell_stored_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """What the cell's cache holds when `generate` returns (its measured `kv_cache_bytes`)."""
    strategy = get_strategy(cell.cache)
    return strategy.held_bytes(shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens - 1)


def cell_device_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """Of what the cell's cache holds, the bytes on the device at a decode step's peak: all of it, or for an
    offloaded cache the layers it keeps there and the `device_layers` largest of those it moves (the memory the
    planner fits the GPU with)."""
    strategy = get_strategy(cell.cache)
    if not strategy.offloading:
        return cell_stored_kv_bytes(cell, shape)
    decoded = cell.max_new_tokens - 1
    return device_kv_bytes(strategy, shape, cell.batch_size, cell.dtype, cell.context_length, decoded)


def cell_returned_device_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """Of what the cell's cache holds when `generate` returns, the bytes on the device: the moment
    `kv_cache_device_bytes` is read, so `predicted_kv_device_bytes` is this (an offloaded cache: one moved layer
    there, not the two of a decode step's peak)."""
    strategy = get_strategy(cell.cache)
    if not strategy.offloading:
        return cell_stored_kv_bytes(cell, shape)
    decoded = cell.max_new_tokens - 1
    return returned_device_kv_bytes(strategy, shape, cell.batch_size, cell.dtype, cell.context_length, decoded)
