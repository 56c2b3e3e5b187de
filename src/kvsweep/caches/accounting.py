"""The bytes each kind of cache holds, exactly: one function per way of storing K and V.

A strategy names its function in the registry (`CacheStrategy.stored_bytes`); the planner, the memory
estimate and the cell's decode-bytes figure all call it, and tests compare it with real caches byte
for byte. The dense formula is also the yardstick every measured `kv_cache_bytes` is compared with.
"""

from collections.abc import Callable

from kvsweep.caches.strategy import CacheStrategy, KvDims
from kvsweep.dtypes import DTYPE_BYTES

# Tokens each quantized layer keeps unquantized before flushing them into the packed store
# (transformers' QuantizedLayer default `residual_length`).
QUANTIZED_RESIDUAL_TOKENS = 128
QUANTIZED_GROUP_SIZE = 64

PackedCodes = Callable[[int], int]  # elements of one tensor -> bytes of its packed codes


def dense_kv_bytes(shape: KvDims, tokens: int, batch: int, dtype: str) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes per element."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * batch * DTYPE_BYTES[dtype]


def dense_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """Every cached token in the model's dtype (offloaded: host plus device)."""
    return dense_kv_bytes(shape, prompt + decoded, batch, dtype)


def reserved_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """A static layout: its reserved length, or the request's when nothing is reserved."""
    return dense_kv_bytes(shape, max(prompt + decoded, strategy.reserve_tokens or 0), batch, dtype)


def no_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    return 0


def quanto_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """quanto cuts a tensor into rows of one group, packs `8 // nbits` rows into one byte-row and pads the last."""
    nbits = _nbits(strategy)

    def codes(elements: int) -> int:
        rows = elements // QUANTIZED_GROUP_SIZE
        return -(-rows // (8 // nbits)) * QUANTIZED_GROUP_SIZE

    return quantized_bytes(shape, batch, dtype, prompt, decoded, codes)


def hqq_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """HQQ packs 1, 2, 4 and 8-bit codes within a group into whole bytes."""
    nbits = _nbits(strategy)
    return quantized_bytes(shape, batch, dtype, prompt, decoded, lambda elements: elements * nbits // 8)


def quantized_bytes(shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int, packed_codes: PackedCodes) -> int:
    """A transformers QuantizedLayer cache, given how many bytes its backend packs a tensor's codes into.

    The whole prompt is quantized at the first update; each decode step appends one token to an
    unquantized residual, and when the residual would reach `QUANTIZED_RESIDUAL_TOKENS` everything is
    re-quantized and the residual emptied. So the residual is `decoded % QUANTIZED_RESIDUAL_TOKENS`
    tokens, and the rest is packed codes plus a scale and a zero point per group of
    `QUANTIZED_GROUP_SIZE` elements (stored in the model's dtype).
    """
    residual = decoded % QUANTIZED_RESIDUAL_TOKENS
    per_tensor = shape.kv_heads * shape.head_dim * (prompt + decoded - residual) * batch  # one layer's K (or V)
    scales_and_zeros = (per_tensor // QUANTIZED_GROUP_SIZE) * 2 * DTYPE_BYTES[dtype]
    quantized = 2 * shape.layers * (packed_codes(per_tensor) + scales_and_zeros)
    return quantized + dense_kv_bytes(shape, residual, batch, dtype)


def _nbits(strategy: CacheStrategy) -> int:
    if strategy.nbits is None:
        raise ValueError(f"{strategy.name}: a quantized strategy needs nbits")
    return strategy.nbits
