"""The bytes each kind of cache holds, exactly: one function per way of storing K and V; and the device
bytes a decode step moves for it, one function per way of reading them.

A strategy names its functions in the registry (`CacheStrategy.stored_bytes`, `decode_step_bytes`); the
planner, the memory estimate and the cell's decode-bytes figure all call them, and tests compare the
stored bytes with real caches byte for byte. The dense formula is also the yardstick every measured
`kv_cache_bytes` is compared with.
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


def allocated_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, decoded: int
) -> int:
    """Bytes the cache's tensors span after `decoded` decode steps of a call that makes `new` tokens: a
    preallocating (static) layout is allocated for the whole call before the prefill, so it spans its
    full length from the start."""
    return strategy.held_bytes(shape, batch, dtype, prompt, new - 1 if strategy.preallocates else decoded)


def attended_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, step: int
) -> int:
    """Decode step `step` (1 ..) of a dense or static cache: attention reads the cache as it is after the
    step's update (a static layout at its full allocation)."""
    return allocated_bytes(strategy, shape, batch, dtype, prompt, new, step)


def quantized_step_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, step: int
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
