"""Bundled architecture presets: published shapes of real models, built with random weights.

Timing and memory depend on shapes, not weight values, so a preset measures a real model's KV
cache behaviour without a download. Quality numbers on presets are shape-only.
"""

from dataclasses import dataclass, field
from typing import Any

from kvsweep.names import ResultTag


@dataclass(frozen=True)
class Preset:
    name: str
    model_type: str  # transformers config class key: llama, qwen2, mistral
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # where the shapes come from

    def parameters(self) -> int:
        """Exact parameter count of the decoder families the presets use (llama, qwen2, mistral).

        Planning reads it from here instead of building the model on the meta device, so a
        sweep of presets plans without importing torch or Transformers.
        """
        c = self.config
        hidden, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or hidden // heads
        q_width, kv_width = heads * head_dim, c.get("num_key_value_heads", heads) * head_dim
        attention = hidden * (q_width + 2 * kv_width) + q_width * hidden
        if self.model_type == "qwen2" or c.get("attention_bias"):
            attention += q_width + 2 * kv_width
        mlp = 3 * hidden * c["intermediate_size"]
        per_layer = attention + mlp + 2 * hidden  # two RMSNorm weights
        head = 0 if c.get("tie_word_embeddings") else vocab * hidden
        return vocab * hidden + layers * per_layer + hidden + head


def _llama3_rope(theta: float) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def _default_rope(theta: float) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta}


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "tiny-llama",
            "llama",
            dict(
                vocab_size=1024,
                hidden_size=128,
                intermediate_size=256,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=4096,
                rope_parameters=_default_rope(10000.0),
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            "kvsweep test model (GQA, 4 layers)",
        ),
        Preset(
            "smollm2-135m",
            "llama",
            dict(
                vocab_size=49152,
                hidden_size=576,
                intermediate_size=1536,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                max_position_embeddings=8192,
                rope_parameters=_default_rope(100000.0),
                rms_norm_eps=1e-5,
                tie_word_embeddings=True,
            ),
            "HuggingFaceTB/SmolLM2-135M",
        ),
        Preset(
            "tinyllama-1.1b",
            "llama",
            dict(
                vocab_size=32000,
                hidden_size=2048,
                intermediate_size=5632,
                num_hidden_layers=22,
                num_attention_heads=32,
                num_key_value_heads=4,
                max_position_embeddings=2048,
                rope_parameters=_default_rope(10000.0),
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        ),
        Preset(
            "qwen2.5-7b",
            "qwen2",
            dict(
                vocab_size=152064,
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                max_position_embeddings=131072,
                rope_parameters=_default_rope(1000000.0),
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
                use_sliding_window=False,
            ),
            "Qwen/Qwen2.5-7B",
        ),
        Preset(
            "llama-3.1-8b",
            "llama",
            dict(
                vocab_size=128256,
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                max_position_embeddings=131072,
                rope_parameters=_llama3_rope(500000.0),
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            "meta-llama/Llama-3.1-8B",
        ),
        Preset(
            "mistral-7b",
            "mistral",
            dict(
                vocab_size=32768,
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                max_position_embeddings=32768,
                rope_parameters=_default_rope(1000000.0),
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                sliding_window=None,
            ),
            "mistralai/Mistral-7B-v0.3",
        ),
    ]
}


def shape_only_tags(model: str) -> dict[str, str]:
    """Random-weight presets measure shapes; their quality numbers say little about trained weights."""
    return {ResultTag.SHAPE_ONLY: str(model in PRESETS).lower()}  # presets win over paths (models.resolve)
