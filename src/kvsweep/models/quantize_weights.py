"""Quantizing a model's weights under a scheme: the Transformers config a checkpoint loads with, and the same
quantization applied in place to a preset's random weights, so that both measure the same modules.

Transformers' own quantizer decides which modules, never a list of ours: both paths run its `preprocess_model`
and its quantize op per weight. In Transformers 5.25 every backend here converts what `should_convert_module` lets
through `get_modules_to_not_convert` (quantizers/base.py): with no skip list of ours, every `nn.Linear` but the
`get_keys_to_not_convert` ones (the lm_head, the module of the last parameter, weights tied to the embeddings) and
`_keep_in_fp32_modules`. quanto replaces any `isinstance(m, nn.Linear)`, bitsandbytes only `type(m) is nn.Linear`,
torchao quantizes any `nn.Linear`'s weight in place. Embeddings, norms, gpt-oss's router and fused experts are not
`nn.Linear`, so stay in the model's dtype.

Also here: what a built model's weights really occupy (`stored_bytes`: the cell's `weights_bytes`, the bytes a
decode step reads in `measure/bandwidth.py`, the check on `weight_schemes.py`'s formulas), and the label of a
checkpoint quantized already, so a cell records it and the planner refuses to quantize it again.
"""

from collections.abc import Iterator, Mapping
from typing import Any

from kvsweep.models.weight_schemes import TORCHAO_GROUP, WeightScheme


def quantization_config(scheme: WeightScheme, compute_dtype: Any) -> Any:
    """The Transformers config for `from_pretrained(quantization_config=...)`, each library's defaults otherwise
    (bitsandbytes: no double quantization).

    bitsandbytes 4-bit computes in the cell's dtype (`compute_dtype`, a torch dtype), as a deployment does:
    left unset, Transformers sets float32 explicitly, bitsandbytes then never switches to the input's dtype,
    and every forward casts to float32, slower than any real bnb-nf4 server. The stored bytes are the same."""
    if scheme.backend == "quanto":
        from transformers import QuantoConfig

        return QuantoConfig(weights=f"int{scheme.bits}")
    if scheme.backend == "bnb":
        from transformers import BitsAndBytesConfig

        if scheme.bits == 8:
            return BitsAndBytesConfig(load_in_8bit=True)
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    from torchao.quantization import Int4WeightOnlyConfig
    from transformers import TorchAoConfig

    # tinygemm's layout: its kernel ships with torch itself (the "plain" default needs fbgemm-gpu-genai)
    return TorchAoConfig(Int4WeightOnlyConfig(group_size=TORCHAO_GROUP, int4_packing_format="tile_packed_to_4d"))


def quantize_built_model(model: Any, scheme: WeightScheme) -> None:
    """Quantize a built model (a preset's random weights, already on its devices) in place, exactly as
    `from_pretrained(..., quantization_config=quantization_config(scheme))` would: the same Transformers quantizer
    replaces the same modules (`preprocess_model`), then each weight goes through the quantizer's own quantize op,
    the rest back where it was, one weight at a time (peak: the model plus one quantized weight)."""
    import torch
    from transformers.modeling_utils import local_torch_dtype
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization_config(scheme, model.dtype), pre_quantized=False)
    quantizer.validate_environment(device_map=None, weights_only=True)
    tensors = dict(model.state_dict(keep_vars=True))  # the built tensors, by name; tied ones under each name
    with local_torch_dtype(model.dtype):  # from_pretrained replaces modules under the model's default dtype
        quantizer.preprocess_model(model=model, dtype=model.dtype, device_map=None, checkpoint_files=None)
    quantize = quantizer.get_quantize_ops()
    for name in list(tensors):
        tensor = tensors.pop(name)
        if quantizer.param_needs_quantization(model, name):
            done = quantize.convert({name: [tensor]}, model=model, full_layer_name=name, missing_keys=set())
            for target, value in done.items():
                _put(model, target, value)
        elif _current(model, name).device.type == "meta":  # a replaced module's bias, say
            _put(model, name, tensor)
        del tensor
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)
    left = [name for name, t in model.state_dict(keep_vars=True).items() if t.device == torch.device("meta")]
    if left:
        raise RuntimeError(f"{scheme.name}: {len(left)} tensors left unloaded after quantization, e.g. {left[0]}")


def _current(model: Any, name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(module_name), attr)


def _put(model: Any, name: str, value: Any) -> None:
    """Set a parameter or buffer as Transformers' loader does (`set_param_for_module`)."""
    import torch

    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    if attr not in module._buffers and not isinstance(value, torch.nn.Parameter):
        value = torch.nn.Parameter(value, requires_grad=value.is_floating_point())
    setattr(module, attr, value)


def stored_bytes(model: Any) -> int:
    """The bytes a built model's parameters and persistent buffers occupy (what a checkpoint of it holds; not
    rotary tables), counted from their storages: a quantized tensor's inner tensors (quanto's data, scales, shifts;
    torchao's qdata, scale_and_zero), a bitsandbytes weight's quant state (absmax, code) or row scales (SCB).
    A storage shared by several tensors (tied weights) counts once; a storage larger than its view counts whole."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in _model_tensors(model):
        for leaf in _leaves(tensor):
            key = (str(leaf.device), leaf.untyped_storage().data_ptr() if leaf.device.type != "meta" else id(leaf))
            if key in seen or leaf.numel() == 0:
                continue
            seen.add(key)
            meta = leaf.device.type == "meta"
            total += leaf.numel() * leaf.element_size() if meta else leaf.untyped_storage().nbytes()
    return total


def _model_tensors(model: Any) -> Iterator[Any]:
    for module in model.modules():
        yield from (p for p in module._parameters.values() if p is not None)
        persistent = (b for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set)
        yield from (b for b in persistent if b is not None)


def _leaves(tensor: Any) -> Iterator[Any]:
    """The plain tensors holding `tensor`'s data: itself, or a wrapper subclass's inner tensors, recursively, and
    the tensors bitsandbytes keeps beside a quantized weight."""
    import torch

    state, scb = getattr(tensor, "quant_state", None), getattr(tensor, "SCB", None)
    if state is not None or isinstance(scb, torch.Tensor):  # bitsandbytes: Params4bit, Int8Params
        yield tensor.data
        yield from _state_tensors(state)  # 4-bit: absmax and code
        if isinstance(scb, torch.Tensor):
            yield scb  # int8: a float32 scale per output row
        return
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if inner is not None:
                yield from _leaves(inner)
        return
    yield tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor


def _state_tensors(state: Any) -> Iterator[Any]:
    """A bitsandbytes QuantState's tensors (absmax, code, offset), its nested state's too (double quantization)."""
    import torch

    if state is None:
        return
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) is type(state):
            yield from _state_tensors(value)


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
