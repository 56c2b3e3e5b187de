"""Instantiate a model on the cell's device, in the cell's dtype.

Presets get seeded random weights without transformers' default init (which walks every module
with slow per-layer initialisers): the module is created straight on the target device with init
skipped, then every parameter is filled with one fast seeded draw.
"""

from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.initialization import no_init_weights

from kvsweep.dtypes import DTYPE_BYTES
from kvsweep.models.gguf_source import dequantizing
from kvsweep.models.quantize_weights import quantization_config, quantize_built_model
from kvsweep.models.resolve import ModelRef, load_config, pretrained_args
from kvsweep.models.weight_schemes import WeightScheme, weight_scheme

INIT_STD = 0.02


def torch_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a grid dtype name (the names and their byte sizes live in `kvsweep.dtypes`)."""
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPE_BYTES)}")
    return getattr(torch, name)


def build_model(
    ref: ModelRef, dtype: str, device: str, seed: int, trust_remote_code: bool = False, weights: str = "none"
) -> PreTrainedModel:
    """`weights`: a weight quantization (`grid.weights`) applied as the model loads: a checkpoint through
    Transformers' quantizer (`quantization_config`), a preset's random weights quantized in place, the same
    modules either way."""
    torch_dtype = torch_dtype_of(dtype)
    scheme = weight_scheme(weights)
    if ref.kind == "preset":
        model = _random_model(ref, torch_dtype, device, seed)
        if scheme is not None:
            quantize_built_model(model, scheme)
    else:
        source, options = load_options(ref, scheme, torch_dtype)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, device_map=device, trust_remote_code=trust_remote_code, **options
        )
    model.eval()
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens
    return model


def load_options(ref: ModelRef, scheme: WeightScheme | None, dtype: torch.dtype) -> tuple[str, dict[str, Any]]:
    """What `from_pretrained` loads a checkpoint from, and how: the weight quantization asked for (computing in
    `dtype`), or for a GGUF file its name and its weights dequantized into the dtype asked for
    (`models/gguf_source.py`)."""
    source, gguf = pretrained_args(ref)
    if scheme is not None:
        return source, {**gguf, "quantization_config": quantization_config(scheme, dtype)}  # GGUF: Transformers refuses
    return source, {**gguf, **(dequantizing() if gguf else {})}


def _random_model(ref: ModelRef, dtype: torch.dtype, device: str, seed: int) -> PreTrainedModel:
    config = load_config(ref)
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # skipped under no_init_weights; tied presets would carry a second lm_head
    fill_random_weights(model, seed)
    return model


@torch.no_grad()
def fill_random_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded N(0, 0.02) matrices, unit norms, zero biases: sane activations, no NaNs."""
    for index, (name, param) in enumerate(model.named_parameters()):
        generator = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + index)
        if param.ndim == 1 and "norm" in name:
            param.fill_(1.0)
        elif param.ndim == 1:
            param.zero_()
        else:
            param.normal_(0.0, INIT_STD, generator=generator)
