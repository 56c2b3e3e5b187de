"""A cell's KV bytes: the dense yardstick, what its strategy holds, and what a decode step reads.

The byte accounting itself belongs to each strategy (`caches/accounting.py`, named in the registry);
this module applies it to a cell's request.
"""

from collections.abc import Callable
from dataclasses import dataclass

from kvsweep.caches import CacheStrategy, get_strategy
from kvsweep.caches.accounting import QUANTIZED_RESIDUAL_TOKENS, dense_kv_bytes
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape


def mean_decode_kv_bytes(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int
) -> float:
    """Cache bytes a decode step reads, averaged over the call's decode steps.

    Step j (1 .. new-1) attends over the prompt and j decoded tokens, reading the cache as it is after
    that step's update (a static cache is read at its full reserved length).
    """
    return _mean_over_decode(_allocated(strategy, shape, batch, dtype, prompt, new), new)


@dataclass(frozen=True)
class DecodeKvTraffic:
    """A decode step's cache bytes, averaged over the call's decode steps, by the path they take."""

    device_bytes: float  # through device memory: the cache's part of `decode_bytes_per_token`
    host_link_bytes: float  # between host and device memory, both ways (an offloaded cache; else 0)


def decode_kv_traffic(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int
) -> DecodeKvTraffic:
    """The cache bytes a decode step moves, as Transformers' cache layers move them.

    Dense and static: attention reads the cache after the step's update (`mean_decode_kv_bytes`).
    Offloaded: `Cache.update` brings every layer to the device before its attention and sends the
    whole layer back after its update (kvsweep's models have no sliding layers, which would stay), so
    the host link carries the cache as it was before the step and as it is after; attention still reads
    each layer from device memory, so the device figure is the dense one. Quantized:
    `quantized_step_bytes`. Appending the new token to the stored cache is the cache's own update and
    is not counted (a dynamic layer concatenates it into a new tensor; a static one writes one slot).
    """
    if strategy.family == "quantized":
        device = _mean_over_decode(lambda j: quantized_step_bytes(strategy, shape, batch, dtype, prompt, j), new)
    else:
        device = mean_decode_kv_bytes(strategy, shape, batch, dtype, prompt, new)
    link = 0.0
    if strategy.offloading:
        allocated = _allocated(strategy, shape, batch, dtype, prompt, new)
        link = _mean_over_decode(lambda j: allocated(j - 1) + allocated(j), new)
    return DecodeKvTraffic(device, link)


def quantized_step_bytes(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, step: int
) -> int:
    """Device bytes decode step `step` (1 ..) of a Transformers `QuantizedLayer` cache moves, as `update` runs.

    Before the step each layer's K (and V) holds q tokens packed (codes, scales, zero points) and r in
    a dense residual: r = (step - 1) % residual length, q = prompt + step - 1 - r. `update` dequantizes
    the packed part (reads the payload, writes q dense tokens), concatenates that with the residual and
    the new token (reads q + r + 1 dense tokens, writes prompt + step), and attention reads the result:

        held(step - 1) + dense(1) + 2 dense(q) + 2 dense(prompt + step)

    over every layer, K and V. Not counted, so this is a floor: the residual's own append and the
    re-quantization every residual length (the cache's update, as a dynamic cache's append is not
    counted), and a backend's temporaries inside dequantize (HQQ unpacks, subtracts, scales).
    """
    residual = (step - 1) % QUANTIZED_RESIDUAL_TOKENS
    packed_tokens = prompt + step - 1 - residual
    stored = strategy.held_bytes(shape, batch, dtype, prompt, step - 1)  # the payload and the residual

    def dense(tokens: int) -> int:
        return dense_kv_bytes(shape, tokens, batch, dtype)

    return stored + dense(1) + 2 * dense(packed_tokens) + 2 * dense(prompt + step)


def _allocated(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int
) -> Callable[[int], int]:
    """Bytes the cache's tensors span after a number of decode steps: a static layout is allocated for
    the whole call up front, so it spans its full length at every step."""
    if strategy.preallocates:
        return lambda decoded: strategy.held_bytes(shape, batch, dtype, prompt, new - 1)
    return lambda decoded: strategy.held_bytes(shape, batch, dtype, prompt, decoded)


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
