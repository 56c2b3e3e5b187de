"""A small random-weight Llama whose KV cache, not its weights or activations, fills its memory.

16 layers of 2 x 64-wide K/V heads on a 32-wide model: 16 KiB of keys and values a token in float32,
eight times what a token's activations take, so a memory limit is reached by the cache, as on a real
long-context GPU. Capacity tests, the search-cost benchmark and the docs' screenshots measure it.
"""

from pathlib import Path

KV_HEAVY_CONFIG = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=16,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def save_kv_heavy(folder: Path, seed: int = 0) -> Path:
    """The model saved with `save_pretrained` into `folder` (kept when it is there already); no tokenizer."""
    if not (folder / "config.json").exists():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        LlamaForCausalLM(LlamaConfig(**KV_HEAVY_CONFIG)).save_pretrained(folder)
    return folder
