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
    model_type: str  # transformers config class key: llama, qwen2, qwen3, mistral, gemma3_text, gpt_oss
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # where the shapes come from
    same_shapes: tuple[str, ...] = ()  # other Hub checkpoints with these shapes (instruct tunes, longer-context ones)

    def parameters(self) -> int:
        """Exact parameter count of the decoder families the presets use (llama, qwen2, qwen3, mistral,
        gemma3_text, gpt_oss), every expert of a mixture of experts included (all of them are in memory).

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
        if self.model_type in ("qwen3", "gemma3_text"):
            attention += 2 * head_dim  # q_norm and k_norm
        if self.model_type == "gpt_oss":
            attention += hidden + heads  # o_proj's bias and one attention sink per head
        per_layer = attention + self._mlp() + (4 if self.model_type == "gemma3_text" else 2) * hidden  # RMSNorms
        head = 0 if c.get("tie_word_embeddings") else vocab * hidden
        return vocab * hidden + layers * per_layer + hidden + head

    def _mlp(self) -> int:
        """One layer's MLP: gate, up and down projections, or (gpt_oss) a router and every expert with biases."""
        c = self.config
        hidden, inner = c["hidden_size"], c["intermediate_size"]
        if self.model_type != "gpt_oss":
            return 3 * hidden * inner
        experts = c["num_local_experts"]
        return hidden * experts + experts + experts * (hidden * 2 * inner + 2 * inner + inner * hidden + hidden)


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
            ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct-1M"),
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
            ("meta-llama/Llama-3.1-8B-Instruct",),
        ),
        Preset(
            "llama-3.1-70b",
            "llama",
            dict(
                vocab_size=128256,
                hidden_size=8192,
                intermediate_size=28672,
                num_hidden_layers=80,
                num_attention_heads=64,
                num_key_value_heads=8,
                max_position_embeddings=131072,
                rope_parameters=_llama3_rope(500000.0),
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            "meta-llama/Llama-3.1-70B",
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
        Preset(
            "qwen3-8b",
            "qwen3",
            dict(
                vocab_size=151936,
                hidden_size=4096,
                intermediate_size=12288,
                num_hidden_layers=36,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                max_position_embeddings=40960,
                rope_parameters=_default_rope(1000000.0),
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
                attention_bias=False,
                use_sliding_window=False,
                sliding_window=None,
                max_window_layers=36,
            ),
            "Qwen/Qwen3-8B",
        ),
        Preset(
            "gemma-3-12b",
            "gemma3_text",
            dict(
                vocab_size=262208,
                hidden_size=3840,
                intermediate_size=15360,
                num_hidden_layers=48,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=256,
                query_pre_attn_scalar=256,
                max_position_embeddings=131072,
                sliding_window=1024,
                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 8,  # 5 local : 1 global
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": _default_rope(10000.0),
                },
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
            ),
            "google/gemma-3-12b-pt (its text decoder; the vision tower is not built)",
        ),
        Preset(
            "gpt-oss-20b",
            "gpt_oss",
            dict(
                vocab_size=201088,
                hidden_size=2880,
                intermediate_size=2880,
                num_hidden_layers=24,
                num_attention_heads=64,
                num_key_value_heads=8,
                head_dim=64,
                max_position_embeddings=131072,
                sliding_window=128,
                layer_types=["sliding_attention", "full_attention"] * 12,
                num_local_experts=32,
                num_experts_per_tok=4,
                rope_parameters={
                    "rope_type": "yarn",
                    "rope_theta": 150000.0,
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "original_max_position_embeddings": 4096,
                    "truncate": False,
                },
                rms_norm_eps=1e-5,
                attention_bias=True,
                tie_word_embeddings=False,
            ),
            "openai/gpt-oss-20b (experts built dense in the cell's dtype, not MXFP4 as published)",
        ),
    ]
}


def shape_only_tags(model: str) -> dict[str, str]:
    """Random-weight presets measure shapes; their quality numbers say little about trained weights."""
    return {ResultTag.SHAPE_ONLY: str(model in PRESETS).lower()}  # presets win over paths (models.resolve)


def preset_for_hub(repo_id: str) -> Preset | None:
    """The bundled preset with a Hub checkpoint's shapes (its source or one of the same shapes), None if none:
    what a plan made where the Hub is not reachable reads instead of the checkpoint's config."""
    return next((p for p in PRESETS.values() if repo_id == p.source or repo_id in p.same_shapes), None)
