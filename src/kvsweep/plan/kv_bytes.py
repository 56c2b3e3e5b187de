"""KV cache bytes from model shapes: the one formula the planner, the runner's checks and the report use.

The dense formula is the yardstick every measured `kv_cache_bytes` is compared with; `stored_kv_bytes`
is what a strategy really holds, exactly (tests compare it with measured caches byte for byte).
"""

from kvsweep.caches import QUANTIZED_GROUP_SIZE, QUANTIZED_RESIDUAL_TOKENS, CacheStrategy, get_strategy
from kvsweep.dtypes import DTYPE_BYTES
from kvsweep.grid import Cell
from kvsweep.models.resolve import KvShape


def dense_kv_bytes(shape: KvShape, tokens: int, batch: int, dtype: str) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes per element."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * batch * DTYPE_BYTES[dtype]


def stored_kv_bytes(strategy: CacheStrategy, shape: KvShape, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """Bytes the strategy holds after the prompt and `decoded` decode steps (offloaded: host plus device).

    Static layouts hold their reserved length. Quantized layers quantize the whole prompt at the first
    update; each decode step appends one token to an unquantized residual, and when the residual would
    reach `QUANTIZED_RESIDUAL_TOKENS` everything is re-quantized and the residual emptied. So the
    residual is `decoded % QUANTIZED_RESIDUAL_TOKENS` tokens, and the rest is packed codes plus a scale
    and a zero point per group of `QUANTIZED_GROUP_SIZE` elements (stored in the model's dtype).
    """
    tokens = prompt + decoded
    if strategy.implementation is None:
        return 0
    if strategy.preallocates:
        return dense_kv_bytes(shape, max(tokens, strategy.reserve_tokens or 0), batch, dtype)
    if strategy.nbits is None:
        return dense_kv_bytes(shape, tokens, batch, dtype)
    residual = decoded % QUANTIZED_RESIDUAL_TOKENS
    per_tensor = shape.kv_heads * shape.head_dim * (tokens - residual) * batch  # one layer's K (or V)
    codes = packed_code_bytes(strategy, per_tensor)
    scales_and_zeros = (per_tensor // QUANTIZED_GROUP_SIZE) * 2 * DTYPE_BYTES[dtype]
    return 2 * shape.layers * (codes + scales_and_zeros) + dense_kv_bytes(shape, residual, batch, dtype)


def packed_code_bytes(strategy: CacheStrategy, elements: int) -> int:
    """Bytes of one tensor's packed codes. Both backends cut it into rows of one group each; quanto
    packs `8 // nbits` rows into one byte-row and pads the last byte-row, HQQ packs within a group."""
    assert strategy.nbits is not None
    if strategy.backend == "quanto":
        rows = elements // QUANTIZED_GROUP_SIZE
        per_byte = 8 // strategy.nbits
        return -(-rows // per_byte) * QUANTIZED_GROUP_SIZE
    return elements * strategy.nbits // 8


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
        return float(stored_kv_bytes(strategy, shape, batch, dtype, prompt, new - 1))
    return sum(stored_kv_bytes(strategy, shape, batch, dtype, prompt, j) for j in steps) / len(steps)


def cell_dense_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """The contract's `kv_cache_bytes_dense` for a cell: every cached token in the model's dtype."""
    return dense_kv_bytes(shape, cell.cached_tokens, cell.batch_size, cell.dtype)


def cell_stored_kv_bytes(cell: Cell, shape: KvShape) -> int:
    """What the cell's cache holds when `generate` returns (its measured `kv_cache_bytes`)."""
    strategy = get_strategy(cell.cache)
    return stored_kv_bytes(strategy, shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens - 1)
