"""The bytes each kind of cache holds, exactly: one function per way of storing K and V; and the device
bytes a decode step moves for it, one function per way of reading them.

A strategy names its functions in the registry (`CacheStrategy.stored_bytes`, `decode_step_bytes`); the planner,
the memory estimate and the cell's decode-bytes figure all call them, and tests compare the stored bytes with real
caches byte for byte. The dense formula is also the yardstick every measured `kv_cache_bytes` is compared with.
"""

from collections.abc import Callable
from dataclasses import replace

from kvsweep.caches.layer_tokens import layer_kv_bytes, state_bytes, windowed_kv_bytes
from kvsweep.caches.strategy import CacheStrategy, KvDims
from kvsweep.units import DTYPE_BYTES

# (elements of one K or V tensor, the axis its groups run along) -> bytes of its packed codes
PackedCodes = Callable[[int, int], int]


def dense_kv_bytes(shape: KvDims, tokens: int, batch: int, dtype: str) -> int:
    """2 (K and V) x kv_heads x head_dim x the tokens each layer keeps of `tokens` x batch x bytes per element,
    summed over the layers: a full-attention layer keeps all of them, a sliding-window or chunked one at most its
    window, a state or shared layer none (`layer_tokens.window_tokens`). A model of full-attention layers only:
    2 x layers x ..."""
    return sum(windowed_kv_bytes(shape, tokens, batch, dtype))


def kept_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """Every token each layer keeps (`layer_tokens.kept_tokens`), in the model's dtype, and any state layers'
    states: a dynamic layout's tokens so far, a static one's full length (`CacheStrategy.static_length`), a
    sliding layer at most its window; offloaded: host plus device."""
    return sum(layer_kv_bytes(strategy, shape, batch, dtype, prompt, decoded)) + state_bytes(shape, batch, dtype)


def allocated_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, decoded: int
) -> int:
    """Bytes the cache's tensors span after `decoded` decode steps of a call that makes `new` tokens (a static
    layout: its full length from the start, `CacheStrategy.allocated_steps`)."""
    return strategy.held_bytes(shape, batch, dtype, prompt, strategy.allocated_steps(new, decoded))


def attended_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, step: int
) -> int:
    """Decode step `step` (1 ..) of a dense or static cache: attention reads the cache as it is after the
    step's update (a static layout at its full allocation), on the device even when offloaded (an offloaded
    sliding layer is read as a resident one: the concatenation, before only its view goes to the host)."""
    if strategy.offloading:
        strategy = replace(strategy, device_layers=None)
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
    residual = (step - 1) % strategy.residual_length
    packed_tokens = prompt + step - 1 - residual
    stored = strategy.held_bytes(shape, batch, dtype, prompt, step - 1)  # the payload and the residual

    def dense(tokens: int) -> int:
        return dense_kv_bytes(shape, tokens, batch, dtype)

    return stored + dense(1) + 2 * dense(packed_tokens) + 2 * dense(prompt + step)


FP8_SCALE_BYTES = 4  # Transformers' FP8 layer keeps one float32 scale per K (and per V) tensor


def fp8_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """Transformers' `Fp8QuantizedLayer`: every cached token of K and V in float8_e4m3fn (one byte an element),
    and per layer one float32 scale for K and one for V, fixed by the prompt. No residual: nothing stays dense."""
    return _fp8_elements(shape, batch, prompt + decoded) + shape.layers * 2 * FP8_SCALE_BYTES


def fp8_step_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, new: int, step: int
) -> int:
    """Device bytes decode step `step` (1 ..) of an FP8 cache moves, following `Fp8QuantizedLayer.update`.

    With t = prompt + step tokens after the step and e their K and V elements: the new token is read and scaled
    (dense(1)); the concatenation reads the held codes and writes e new ones; dequantize reads e codes, widens
    them to float32 (writes 4e), multiplies by the scale (reads and writes 4e) and, unless the model computes in
    float32, casts to its dtype (reads 4e, writes dense(t)); attention reads dense(t). Not counted, so a floor:
    the one-token temporaries of quantizing the new token.
    """
    tokens = prompt + step
    elements = _fp8_elements(shape, batch, tokens)
    dense = dense_kv_bytes(shape, tokens, batch, dtype)
    widen = 4 * elements + 2 * 4 * elements + (0 if dtype == "float32" else 4 * elements + dense)
    held = strategy.held_bytes(shape, batch, dtype, prompt, step - 1)
    return held + dense_kv_bytes(shape, 1, batch, dtype) + elements + elements + widen + dense


def _fp8_elements(shape: KvDims, batch: int, tokens: int) -> int:
    """K and V elements of every layer for `tokens` tokens: the FP8 codes' bytes."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * batch


def no_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    return 0


def quanto_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """quanto groups a tensor of n elements (group size g) as n/g rows of g (axis 0) or g rows of n/g
    (axis -1), then packs `8 // nbits` rows into one row of bytes, padding the last:
    codes = ceil(rows / (8 // nbits)) x columns bytes."""
    per_byte = 8 // _nbits(strategy)
    group = strategy.q_group_size

    def codes(elements: int, axis: int) -> int:
        rows, columns = (elements // group, group) if axis == 0 else (group, elements // group)
        return -(-rows // per_byte) * columns

    return quantized_bytes(strategy, shape, batch, dtype, prompt, decoded, codes)


def hqq_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """HQQ groups a tensor of n elements (group size g) as g rows of n/g (axis 0) or n/g rows of g (axis 1)
    and packs down the rows: 8, 4, 2 or 1-bit codes `8 // nbits` rows to a byte, exactly n x nbits / 8
    bytes (the rows must divide evenly: `hqq_problem`); 3-bit codes ten rows to an int32, the rows
    zero-padded to a multiple of ten: ceil(rows / 10) x columns x 4 bytes."""
    nbits = _nbits(strategy)
    group = strategy.q_group_size

    def codes(elements: int, axis: int) -> int:
        if nbits != 3:
            return elements * nbits // 8
        rows, columns = (group, elements // group) if axis == 0 else (elements // group, group)
        return -(-rows // 10) * columns * 4

    return quantized_bytes(strategy, shape, batch, dtype, prompt, decoded, codes)


def quantized_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int, packed_codes: PackedCodes
) -> int:
    """A transformers QuantizedLayer cache, given how many bytes its backend packs a tensor's codes into.

    The whole prompt is quantized at the first update; each decode step appends one token to an
    unquantized residual, and when the residual would reach the strategy's `residual_length` R,
    everything is re-quantized and the residual emptied. So the residual is `decoded % R` tokens, and
    the rest is packed codes (keys grouped along `axis_key`, values along `axis_value`) plus a scale and
    a zero point per group of `q_group_size` elements, stored in the model's dtype.
    """
    residual = decoded % strategy.residual_length
    per_tensor = shape.kv_heads * shape.head_dim * (prompt + decoded - residual) * batch  # one layer's K (or V)
    scales_and_zeros = (per_tensor // strategy.q_group_size) * 2 * DTYPE_BYTES[dtype]
    codes = packed_codes(per_tensor, strategy.axis_key) + packed_codes(per_tensor, strategy.axis_value)
    quantized = shape.layers * (codes + 2 * scales_and_zeros)
    return quantized + dense_kv_bytes(shape, residual, batch, dtype)


def quantized_token_counts(strategy: CacheStrategy, prompt: int, new: int) -> list[int]:
    """The lengths a call quantizes K and V at: the prompt, then prompt + k x R at each residual flush
    (a call of `new` tokens makes `new - 1` decode steps)."""
    flushes = (new - 1) // strategy.residual_length if prompt > 0 else 0
    return [prompt + k * strategy.residual_length for k in range(flushes + 1)]


def quanto_problem(strategy: CacheStrategy, shape: KvDims, batch: int, prompt: int, new: int) -> str | None:
    """quanto's group size must divide the elements per slice of the axis: kv_heads x tokens x head_dim
    (axis 0, one slice per batch row) or batch x kv_heads x tokens (axis -1, one per head-dim channel)."""
    group = strategy.q_group_size
    for tokens in quantized_token_counts(strategy, prompt, new):
        for role, axis in (("key", strategy.axis_key), ("value", strategy.axis_value)):
            if axis == 0:
                per_slice, what = shape.kv_heads * tokens * shape.head_dim, "kv_heads x tokens x head_dim"
            else:
                per_slice, what = batch * shape.kv_heads * tokens, "batch x kv_heads x tokens"
            if per_slice % group:
                return (
                    f"{strategy.name}: quanto's group size {group} must divide {what} = {per_slice} "
                    f"({role} axis {axis}, {tokens} tokens)"
                )
    return None


def hqq_problem(strategy: CacheStrategy, shape: KvDims, batch: int, prompt: int, new: int) -> str | None:
    """HQQ's group size must divide the tensor; along axis 1 its n/g rows must also pack whole bytes
    (a multiple of `8 // nbits`), or HQQ drops codes and fails at the next decode step."""
    group, nbits = strategy.q_group_size, _nbits(strategy)
    for tokens in quantized_token_counts(strategy, prompt, new):
        elements = batch * shape.kv_heads * tokens * shape.head_dim
        if elements % group:
            return (
                f"{strategy.name}: HQQ's group size {group} must divide batch x kv_heads x tokens x head_dim "
                f"= {elements} ({tokens} tokens)"
            )
        per_byte = 8 // nbits
        for role, axis in (("key", strategy.axis_key), ("value", strategy.axis_value)):
            if axis == 1 and nbits != 3 and (elements // group) % per_byte:
                return (
                    f"{strategy.name}: HQQ {nbits}-bit along {role} axis 1 packs {per_byte} groups to a byte, "
                    f"but {tokens} tokens make {elements // group} groups"
                )
    return None


def _nbits(strategy: CacheStrategy) -> int:
    if strategy.nbits is None:
        raise ValueError(f"{strategy.name}: a quantized strategy needs nbits")
    return strategy.nbits
