"""Memory arithmetic from model shapes: dense KV bytes (the contract's formula) and estimates.

The dense formula is the yardstick every measured `kv_cache_bytes` is compared with.
"""

from kvsweep.caches import QUANTIZED_GROUP_SIZE, QUANTIZED_RESIDUAL_TOKENS, CacheStrategy
from kvsweep.dtypes import DTYPE_BYTES
from kvsweep.models.resolve import KvShape


def dense_kv_bytes(shape: KvShape, tokens: int, batch: int, dtype: str) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes per element."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * batch * DTYPE_BYTES[dtype]


def stored_kv_bytes(strategy: CacheStrategy, shape: KvShape, tokens: int, batch: int, dtype: str) -> int:
    """Bytes the strategy holds for `tokens` cached tokens (offloaded: summed over host and device).

    Static layouts hold their reserved length; quantized ones hold packed codes plus a scale and a
    zero point per group, and keep up to the residual window unquantized.
    """
    if strategy.implementation is None:
        return 0
    if strategy.preallocates:
        return dense_kv_bytes(shape, max(tokens, strategy.reserve_tokens or 0), batch, dtype)
    if strategy.nbits is None:
        return dense_kv_bytes(shape, tokens, batch, dtype)
    residual = tokens % QUANTIZED_RESIDUAL_TOKENS if tokens > QUANTIZED_RESIDUAL_TOKENS else tokens
    quantized = tokens - residual
    elements = 2 * shape.layers * shape.kv_heads * shape.head_dim * quantized * batch
    codes = elements * strategy.nbits // 8
    scales = (elements // QUANTIZED_GROUP_SIZE) * 2 * DTYPE_BYTES[dtype]
    return codes + scales + dense_kv_bytes(shape, residual, batch, dtype)
