"""Checkpoints quantized already: the label a model's config.json gives its weights' quantization, so that a
cell records where its weights came from and the planner refuses to quantize them again.
"""

from collections.abc import Mapping
from typing import Any

_FP8_METHODS = {"fp8", "fbgemm_fp8"}
GGUF_METHOD = "gguf"  # Transformers' GgufConfig, set on every model it loads from a GGUF file
_BITS_KEYS = ("bits", "w_bit", "nbits", "weight_bits")


def prequantized_label(config: Mapping[str, Any]) -> str | None:
    """How a config.json says its weights are quantized: `awq-int4`, `gptq-int4`, `fp8`, `bnb-nf4`, `bnb-int8`,
    `quanto-int8`, `compressed-tensors`, `mxfp4`..., the method itself when it names no bit width; None when it
    has no `quantization_config` (a multimodal config's `text_config` counts too), and for a GGUF file's: kvsweep
    loads it dequantized (`models/gguf_source.py`), dense weights whose origin is recorded apart."""
    found = _quantization_section(config)
    if found is None:
        return None
    raw = found.get("quant_method") or ("bitsandbytes" if _bnb_flags(found) else "quantized")
    method = str(getattr(raw, "value", raw)).lower()  # a live config holds Transformers' QuantizationMethod enum
    if method == GGUF_METHOD:
        return None
    if method == "bitsandbytes":
        if found.get("load_in_4bit") or found.get("_load_in_4bit"):
            return f"bnb-{found.get('bnb_4bit_quant_type') or 'fp4'}"
        return "bnb-int8"
    if method in _FP8_METHODS:
        return "fp8"
    if method == "quanto":
        return f"quanto-{found.get('weights') or 'int8'}"
    bits = next((found[key] for key in _BITS_KEYS if isinstance(found.get(key), int)), None)
    label = method.replace("_", "-")
    return f"{label}-int{bits}" if bits is not None else label


def _quantization_section(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for part in (config, config.get("text_config")):
        if isinstance(part, Mapping) and isinstance(part.get("quantization_config"), Mapping):
            return part["quantization_config"]
    return None


def _bnb_flags(found: Mapping[str, Any]) -> bool:
    return any(found.get(key) for key in ("load_in_4bit", "load_in_8bit", "_load_in_4bit", "_load_in_8bit"))
