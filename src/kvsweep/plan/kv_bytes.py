"""A cell's KV bytes: the dense yardstick, what its strategy holds, and what a decode step reads.

The byte accounting itself belongs to each strategy (`caches/accounting.py`, named in the registry);
this module applies it to a cell's request.
"""

from kvsweep.caches import CacheStrategy, get_strategy
from kvsweep.caches.accounting import dense_kv_bytes
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape


def mean_decode_kv_bytes(
    strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, new: int
) -> float:
    """Cache bytes a decode step reads, averaged over the call's decode steps.

    Step j (1 .. new-1) attends over the prompt and j decoded tokens, reading the cache as it is after
    that step's update (a static cache is read at its full reserved length).
    """
    steps = range(1, new)
    if not steps:
        return 0.0
    if strategy.preallocates:  # allocated for the whole call up front, read whole at every step
        return float(strategy.held_bytes(shape, batch, dtype, prompt, new - 1))
    return sum(strategy.held_bytes(shape, batch, dtype, prompt, j) for j in steps) / len(steps)


def cell_dense_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """The contract's `kv_cache_bytes_dense` for a cell: every cached token in the model's dtype."""
    return dense_kv_bytes(shape, cell.cached_tokens, cell.batch_size, cell.dtype)


def cell_stored_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """What the cell's cache holds when `generate` returns (its measured `kv_cache_bytes`)."""
    strategy = get_strategy(cell.cache)
    return strategy.held_bytes(shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens - 1)
