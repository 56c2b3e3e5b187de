"""The shapes that decide a model's KV cache and working memory, read without Transformers.

Reading them from the preset table or a folder's `config.json` keeps torch and Transformers (3-4 s of imports) off
the path to the first cell; only a config this module cannot read (other attribute names, custom code, a Hub id,
layer kinds its config class derives) goes through `AutoConfig`. `KvShape.layer_windows` and `state_elements`
describe Transformers' per-layer types (`caches/layer_tokens.py`); both stay empty for a model whose every layer is
full attention, so such a model is counted exactly as before. `KvShape.layer_types` keeps the types themselves, as
Transformers builds its caches from them: the caches that refuse some types (`QuantizedCache`, continuous batching)
are judged on those names, not on what kvsweep counts for them.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NO_KV = 0  # a layer window that keeps no keys or values (a state layer, a shared or attention-free layer)


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int | None
    hidden_size: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    # Per layer, in cache order; () when every layer is full attention. None: keeps every token; a
    # number: keeps at most that many (a sliding window or an attention chunk); NO_KV: keeps none.
    layer_windows: tuple[int | None, ...] = ()
    # Per layer, elements of its fixed conv/recurrent state per batch row, in the model's dtype; () if none.
    state_elements: tuple[int, ...] = ()
    # Per layer, its type as Transformers' `get_layer_types_and_kwargs` gives it (`cache_layer_types`), even one
    # kvsweep does not know; () when every layer is `full_attention`.
    layer_types: tuple[str, ...] = ()
    query_heads: int = 0  # attention heads (queries): heads x head_dim is the attention width; 0: not known
    # A mixture of experts: experts per layer, how many each token is routed to, one expert's parameters; 0: dense.
    experts: int = 0
    experts_per_token: int = 0
    expert_parameters: int = 0

    @property
    def attention_width(self) -> int:
        """heads x head_dim, what attention multiplies over (gpt-oss: 64 x 64 = 4096 against a hidden size of
        2880); the hidden size where the head count is not known."""
        return (
            self.query_heads * self.head_dim if self.query_heads else self.hidden_size or self.kv_heads * self.head_dim
        )


REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")

# Transformers' layer types (`cache_utils.get_layer_types_and_kwargs`), by what their cache layer keeps.
FULL_TYPES = frozenset({"full_attention", "hybrid"})
WINDOW_TYPES = {"sliding_attention": "sliding_window", "hybrid_sliding": "sliding_window"}
CHUNK_TYPES = {"chunked_attention": "attention_chunk_size"}
STATE_TYPES = frozenset({"conv", "linear_attention", "hybrid", "hybrid_sliding"})
EMPTY_TYPES = frozenset({"dummy", "moe", "mlp"})
NO_ATTENTION_TYPES = frozenset({"moe", "mlp"})  # named "dummy" by `get_layer_types_and_kwargs`, as the cache has them
# Keys from which a config class derives its own layer types when `layer_types` is not written down:
# the plain reader cannot know the rule of every class, so it leaves such a config to Transformers.
DERIVING_KEYS = (
    "sliding_window",
    "attention_chunk_size",
    "sliding_window_pattern",
    "full_attn_idxs",
    "layers_block_type",
    "attn_layer_indices",
    "hybrid_override_pattern",
)
# Model types whose config class derives layer types other than full attention from keys not listed above, or from
# none at all (Falcon-H1's are all "hybrid", Bamba's all Mamba): found by comparing this reader with
# `get_layer_types_and_kwargs` over every config class of Transformers 5.25 (tests/test_layer_type_refusals.py).
DERIVING_MODEL_TYPES = frozenset({"bamba", "falcon_h1", "jamba", "recurrent_gemma"})


def _lfm2_state(text: Mapping[str, Any]) -> int:
    """LFM2's short convolution keeps the last `conv_L_cache` positions of every hidden channel."""
    return text["hidden_size"] * text.get("conv_L_cache", 3)


# State elements per batch row of one state layer, by model type. A model type missing here has its
# state layers counted as holding no bytes (docs/metrics.md says so).
STATE_ELEMENTS: dict[str, Callable[[Mapping[str, Any]], int]] = {"lfm2": _lfm2_state}


def text_part(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's part of a config: multimodal configs nest it under `text_config`."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def shape_from_dict(config: Mapping[str, Any]) -> KvShape | None:
    """Shapes from a plain config mapping, with Transformers' defaults; None if its names differ."""
    text = text_part(config)
    if any(not isinstance(text.get(key), int) for key in REQUIRED):
        return None
    if text.get("kv_sharing_modes") is not None:
        return None  # layers that reuse another's cache: Transformers decides which
    layer_types = text.get("layer_types")
    model_type = text.get("model_type") or config.get("model_type")
    if layer_types is None:
        if any(text.get(key) not in (None, False) for key in DERIVING_KEYS) or model_type in DERIVING_MODEL_TYPES:
            return None  # the config class derives its layer types: only Transformers knows how
        layer_types = ["full_attention"] * text["num_hidden_layers"]
    layout = layer_layout(layer_types, text, model_type)
    if layout is None:
        return None
    heads, hidden = text["num_attention_heads"], text["hidden_size"]
    return KvShape(
        layers=text["num_hidden_layers"],
        kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or hidden // heads,
        max_positions=text.get("max_position_embeddings"),
        hidden_size=hidden,
        intermediate_size=text.get("intermediate_size") or 4 * hidden,
        vocab_size=text["vocab_size"],
        layer_windows=layout[0],
        state_elements=layout[1],
        layer_types=cache_layer_types(layer_types),
        query_heads=heads,
        **expert_routing(text, model_type),
    )


def expert_routing(text: Mapping[str, Any], model_type: str | None) -> dict[str, int]:
    """A mixture of experts' routing, from the names Transformers' MoE configs use (Mixtral and gpt-oss:
    `num_local_experts`; Qwen-MoE and others: `num_experts`, `moe_intermediate_size`); {} for a dense model. One
    expert is a gated MLP (gate, up, down), with biases in gpt-oss."""
    experts = text.get("num_local_experts") or text.get("num_experts") or 0
    routed = text.get("num_experts_per_tok") or text.get("experts_per_token") or 0
    if not (isinstance(experts, int) and isinstance(routed, int) and experts > routed > 0):
        return {}
    hidden = text["hidden_size"]
    inner = text.get("moe_intermediate_size") or text.get("intermediate_size") or 4 * hidden
    per_expert = 3 * hidden * inner + (2 * inner + hidden if model_type == "gpt_oss" else 0)  # gate_up, down biases
    return {"experts": experts, "experts_per_token": routed, "expert_parameters": per_expert}


def cache_layer_types(layer_types: Sequence[str]) -> tuple[str, ...]:
    """The types Transformers builds a cache from (`get_layer_types_and_kwargs` names a "moe" or "mlp" layer
    "dummy"), in order; () when every layer is `full_attention`, as `KvShape.layer_windows` is then."""
    types = tuple("dummy" if layer_type in NO_ATTENTION_TYPES else layer_type for layer_type in layer_types)
    return () if all(layer_type == "full_attention" for layer_type in types) else types


def layer_layout(
    layer_types: Sequence[str],
    text: Mapping[str, Any],
    model_type: str | None,
    windows: Sequence[int | None] | None = None,
    unknown_is_full: bool = False,
) -> tuple[tuple[int | None, ...], tuple[int, ...]] | None:
    """(`layer_windows`, `state_elements`) for these layer types, both () when every layer is full attention.

    `windows`: each layer's window as Transformers resolved it (a chunked layer's chunk included); None
    reads it from the config. None when a type or its window is unknown here, unless `unknown_is_full`
    (the Transformers reader: an unknown kind is counted as full attention, as every layer was before).
    """
    kept: list[int | None] = []
    states: list[int] = []
    state_of = STATE_ELEMENTS.get(model_type or "")
    for index, layer_type in enumerate(layer_types):
        window: int | None
        if layer_type in WINDOW_TYPES or layer_type in CHUNK_TYPES:
            key = WINDOW_TYPES.get(layer_type) or CHUNK_TYPES[layer_type]
            window = text.get(key) if windows is None else windows[index]
            if not isinstance(window, int):
                return None
        elif layer_type in FULL_TYPES:
            window = None
        elif layer_type in STATE_TYPES or layer_type in EMPTY_TYPES:
            window = NO_KV
        elif unknown_is_full:
            window = None
        else:
            return None
        kept.append(window)
        states.append(state_of(text) if layer_type in STATE_TYPES and state_of is not None else 0)
    if all(w is None for w in kept) and not any(states):
        return (), ()
    return tuple(kept), tuple(states) if any(states) else ()
