"""Tiny random-weight models of every layer kind Transformers' caches hold, saved as local folders.

A window of 16 tokens is short enough that a test's context passes it, and each model has at most 4
layers of 2 x 8-wide K/V heads, so a cell runs in about a second on a CPU. The folders carry a plain
`config.json` (with `layer_types` written out, as `save_pretrained` writes it), so planning them goes
through the torch-free shape reader, and running them through Transformers' own caches.
"""

from pathlib import Path
from typing import Any

WINDOW = 16  # tokens a sliding-window (or chunked) layer keeps

_COMMON: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
_ALTERNATING = ["sliding_attention", "full_attention"] * 2

# name -> (Transformers model type, config): one model per layer kind
TINY_LAYER_KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    # every layer slides (Mistral with a window: Transformers derives the types, none are written)
    "tiny-mistral-sliding": ("mistral", dict(_COMMON, sliding_window=WINDOW)),
    # sliding and full layers alternate, as in gpt-oss (and, five to one, Gemma 3)
    "tiny-gemma3-alternating": ("gemma3_text", dict(_COMMON, sliding_window=WINDOW, layer_types=_ALTERNATING)),
    "tiny-gpt-oss-alternating": (
        "gpt_oss",
        dict(_COMMON, sliding_window=WINDOW, layer_types=_ALTERNATING, num_local_experts=4, num_experts_per_tok=2),
    ),
    # chunked attention (Llama 4): the cache keeps a chunk as a sliding layer keeps its window
    "tiny-llama4-chunked": (
        "llama4_text",
        dict(
            _COMMON,
            attention_chunk_size=WINDOW,
            layer_types=["chunked_attention", "full_attention"] * 2,
            intermediate_size_mlp=64,
            num_local_experts=2,
        ),
    ),
    # a hybrid: short-convolution state layers (no K/V) beside full attention (LFM2)
    "tiny-lfm2-hybrid": ("lfm2", dict(_COMMON, layer_types=["conv", "full_attention"] * 2, conv_L_cache=3)),
}


def save_tiny_layer_kind(name: str, folder: Path, seed: int = 0) -> Path:
    """The model saved with `save_pretrained` into `folder` (kept when it is there already); no tokenizer."""
    if not (folder / "config.json").exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        model_type, config = TINY_LAYER_KINDS[name]
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config)).save_pretrained(folder)
    return folder


def tiny_preset_config(name: str) -> tuple[str, dict[str, Any]]:
    """A preset's family and layer pattern at the tiny scale (its first six layer types at most, the window
    cut to `WINDOW`, a few experts for a mixture): what `tests/test_layer_kinds.py` builds and runs on a CPU."""
    from kvsweep.models.presets import PRESETS

    preset = PRESETS[name]
    config = dict(preset.config, **{k: v for k, v in _COMMON.items() if k != "max_position_embeddings"})
    if config.get("layer_types"):
        config["layer_types"] = config["layer_types"][:6]
        config["num_hidden_layers"] = len(config["layer_types"])
    if config.get("sliding_window"):
        config["sliding_window"] = WINDOW
    if "num_local_experts" in config:
        config.update(num_local_experts=4, num_experts_per_tok=2)
    if "query_pre_attn_scalar" in config:
        config["query_pre_attn_scalar"] = _COMMON["head_dim"]
    return preset.model_type, config
