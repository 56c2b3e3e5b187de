"""The shapes that decide a model's KV cache and working memory, read without Transformers.

Planning a sweep needs only a handful of numbers from a model's config. Reading them from the
preset table or a folder's `config.json` keeps torch and Transformers (3-4 s of imports) off the
path from the command to the first cell; only a config this module cannot read (other attribute
names, custom code, a Hub id) goes through Transformers' `AutoConfig`.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int | None
    hidden_size: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0


REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")


def text_part(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's part of a config: multimodal configs nest it under `text_config`."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def shape_from_dict(config: Mapping[str, Any]) -> KvShape | None:
    """Shapes from a plain config mapping, with Transformers' defaults; None if its names differ."""
    text = text_part(config)
    if any(not isinstance(text.get(key), int) for key in REQUIRED):
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
    )
