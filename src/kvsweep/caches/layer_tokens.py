"""What each layer of a cache keeps, as Transformers' cache layers keep it: the per-layer half of the accounting.
Each rule about a kind of layer is written here once; the planner and the byte accounting call these.

A layer's kind is its window (`windows`): None, full attention; a number, a sliding window or chunk; 0, no keys
or values. How a sliding layer holds its window (`kept_tokens`; `DynamicSlidingWindowLayer`,
`StaticSlidingWindowLayer`):

- dynamic: `update` concatenates the kept tokens with the new ones and keeps a view of the last `window - 1`,
  which holds the whole concatenation's storage: the prompt after the prefill, `min(tokens, window)` after a step;
- static: `min(window, CacheStrategy.static_length)` tokens, allocated once before the prefill;
- offloaded (dynamic): the copy to the host takes only the view, `min(tokens, window - 1)`, and comes back as is.

A state layer (linear attention, a short convolution) keeps a fixed state (`layer_states`), and a layer sharing
another's cache keeps nothing. `offloads` follows Transformers' defaults: a `DynamicCache` offloads every attention
layer (`offload_only_non_sliding=False`), a `StaticCache` keeps its sliding layers on the device (`True`).

Some of Transformers' caches refuse some layer types outright, by name (`QUANTIZED_LAYER_TYPES`,
`PAGED_LAYER_TYPES`): `refused_layers` judges a model by its types as Transformers names them (`layer_types`), not
by what kvsweep counts for them, so a "hybrid" layer kvsweep counts as full attention is still refused.
"""

from collections import Counter

from kvsweep.caches.strategy import CacheStrategy, KvDims
from kvsweep.units import DTYPE_BYTES

# Transformers 5.25's `QuantizedCache.__init__` (cache_utils.py, every backend: quanto, HQQ, fp8) raises a ValueError
# when `set(get_layer_types_and_kwargs(config)[0]) - {"full_attention"}` is not empty.
QUANTIZED_LAYER_TYPES = frozenset({"full_attention"})
# Transformers 5.25's continuous batching (generation/continuous_batching/cache.py, `group_layers_by_attn_type`, run
# when `PagedAttentionCache` is built) raises "Invalid layer type" for any type without an allocator in
# `ATTN_TYPE_TO_ALLOCATOR`: only full_attention and sliding_attention have one. It reads the config's `layer_types`
# itself, which differ from `get_layer_types_and_kwargs`'s only in ways refused either way: "moe" / "mlp" (there
# "dummy"), shared layers ("dummy") and a chunk size with no types written (chunked), none of them full attention.
PAGED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def layer_types(shape: KvDims) -> tuple[str, ...]:
    """Each layer's type as Transformers names it (`KvShape.layer_types`; () there: every one full attention)."""
    return shape.layer_types or ("full_attention",) * shape.layers


def refused_layers(shape: KvDims, accepted: frozenset[str]) -> str | None:
    """The layers whose type is not `accepted`, counted by type in model order (`hybrid (36 layers)`), for a reason
    that names them; None when every layer's type is accepted."""
    counts = Counter(kind for kind in layer_types(shape) if kind not in accepted)
    if not counts:
        return None
    return ", ".join(f"{kind} ({n} layer{'' if n == 1 else 's'})" for kind, n in counts.items())


def windows(shape: KvDims) -> tuple[int | None, ...]:
    """Each layer's window, its kind (None: full attention; a number: sliding or chunked; 0: no keys or values)."""
    return shape.layer_windows or (None,) * shape.layers


def layer_states(shape: KvDims) -> tuple[int, ...]:
    """Each layer's fixed state, in elements per batch row (0: none; only a state layer has one)."""
    return shape.state_elements or (0,) * shape.layers


def window_tokens(window: int | None, tokens: int) -> int:
    """Of `tokens` cached tokens, those a layer of this kind keeps: all (full attention), at most its window
    (sliding or chunked), none (0)."""
    return tokens if window is None else min(tokens, window)


def state_bytes(shape: KvDims, batch: int, dtype: str) -> int:
    """Every state layer's fixed state (kept from the prefill on, whatever the length)."""
    return sum(layer_state_bytes(shape, batch, dtype))


def layer_state_bytes(shape: KvDims, batch: int, dtype: str) -> list[int]:
    """Each layer's fixed state in bytes, in order (0 but for a state layer)."""
    return [elements * batch * DTYPE_BYTES[dtype] for elements in layer_states(shape)]


def token_bytes(shape: KvDims, batch: int, dtype: str) -> int:
    """One token of one layer: K and V."""
    return 2 * shape.kv_heads * shape.head_dim * batch * DTYPE_BYTES[dtype]


def windowed_kv_bytes(shape: KvDims, tokens: int, batch: int, dtype: str) -> list[int]:
    """Each layer's K and V with `tokens` tokens cached, as many as its kind keeps (`window_tokens`), in order."""
    one = token_bytes(shape, batch, dtype)
    return [one * window_tokens(w, tokens) for w in windows(shape)]


def kept_tokens(strategy: CacheStrategy, window: int | None, prompt: int, decoded: int, attended: bool = False) -> int:
    """Tokens one layer's K (or V) holds after the prefill and `decoded` decode steps.

    `attended`: what attention reads after that step's update instead (an offloaded dynamic sliding layer
    attends over the concatenation on the device, one token more than the view it sends to the host).
    """
    if window == 0:
        return 0
    if strategy.preallocates:
        return window_tokens(window, strategy.static_length(prompt + decoded))
    tokens = prompt + decoded
    if window is None:
        return tokens
    if strategy.offloading and not attended:
        return min(tokens, window - 1)
    return prompt if decoded == 0 and not attended else min(tokens, window)


def offloads(strategy: CacheStrategy, window: int | None) -> bool:
    """Whether an offloaded strategy moves a layer with this window between host and device each step."""
    if not strategy.offloading or window == 0:
        return False
    return window is None or not strategy.preallocates


def layer_kv_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int, attended: bool = False
) -> list[int]:
    """K and V bytes of every layer, in order (states not included)."""
    one = token_bytes(shape, batch, dtype)
    return [one * kept_tokens(strategy, w, prompt, decoded, attended) for w in windows(shape)]


def offloaded_kv_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int
) -> int:
    """The bytes of the layers the strategy moves over the host link (0 when it does not offload)."""
    return sum(_kept_and_moved(strategy, shape, batch, dtype, prompt, decoded)[1])


def device_kv_bytes(strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
    """Of what the cache holds, the bytes on the device at a decode step's peak: all of it, or for an offloaded
    cache the layers it keeps there and the largest `device_layers` of those it moves (the one in use and the one
    prefetched). What the planner fits a GPU with."""
    kept, moved = _kept_and_moved(strategy, shape, batch, dtype, prompt, decoded)
    return kept + sum(sorted(moved, reverse=True)[: strategy.device_layers])


def returned_device_kv_bytes(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int
) -> int:
    """Of what the cache holds when `generate` returns, the bytes on the device (the measured
    `kv_cache_device_bytes`): all of it, or for an offloaded cache the layers it keeps there and one it moves.
    The last layer's update prefetches the first moved layer (circling back) and then offloads itself, so
    after the call that first moved layer, in layer order, is the one on the device."""
    kept, moved = _kept_and_moved(strategy, shape, batch, dtype, prompt, decoded)
    return kept + (moved[0] if moved else 0)


def _kept_and_moved(
    strategy: CacheStrategy, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int
) -> tuple[int, list[int]]:
    """(the bytes the cache keeps on the device: every layer it does not move and every state; each moved layer's
    bytes, in layer order). A strategy that does not offload moves none (`offloads`)."""
    held = layer_kv_bytes(strategy, shape, batch, dtype, prompt, decoded)
    moves = [offloads(strategy, w) for w in windows(shape)]
    kept = sum(b for b, is_moved in zip(held, moves, strict=True) if not is_moved) + state_bytes(shape, batch, dtype)
    return kept, [b for b, is_moved in zip(held, moves, strict=True) if is_moved]


def quantizable(shape: KvDims) -> bool:
    """Whether Transformers' `QuantizedCache` takes this model: its `__init__` raises unless every layer type
    `get_layer_types_and_kwargs` gives is `full_attention` (`QUANTIZED_LAYER_TYPES`), whatever the backend. A
    layout of other kinds, in a shape built without its types, is refused as well."""
    return _quantized_refusal(shape) is None


def quantized_layers_problem(strategy: CacheStrategy, shape: KvDims, batch: int, prompt: int, new: int) -> str | None:
    """Why a quantized strategy cannot run on this model (a `ShapeProblem`), or None: found before it fails inside
    `generate`, for every backend alike."""
    if strategy.backend is None or (refused := _quantized_refusal(shape)) is None:
        return None
    return (
        f"{strategy.name}: Transformers' QuantizedCache holds only full-attention layers (full_attention); "
        f"this model has {refused}"
    )


def _quantized_refusal(shape: KvDims) -> str | None:
    """The layers `QuantizedCache` refuses, named, or None."""
    refused = refused_layers(shape, QUANTIZED_LAYER_TYPES)
    if refused is None and (shape.layer_windows or shape.state_elements):
        return "sliding-window, chunked or state layers"
    return refused
