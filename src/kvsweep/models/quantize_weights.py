"""Quantizing a model's weights under a scheme: the Transformers config a checkpoint loads with, and the same
quantization applied in place to a preset's random weights, so that both measure the same modules.

Which modules a scheme quantizes is decided by Transformers' own quantizer, never by a list of ours: loading a
checkpoint with `quantization_config(scheme)`, and quantizing a preset's random weights (`quantize_built_model`),
both run the quantizer's `preprocess_model` (module replacement) and its quantize op per weight. In Transformers
5.25 every backend here converts the modules Transformers' `should_convert_module` lets through
`get_modules_to_not_convert` (quantizers/base.py): with no skip list of ours, that is every `nn.Linear` but those
named by `get_keys_to_not_convert` (the output embeddings, i.e. the lm_head; the module of the model's last
parameter; weights tied to the embeddings) and the model's `_keep_in_fp32_modules`. quanto replaces any
`isinstance(m, nn.Linear)` with a `QLinear` (integrations/quanto.py), bitsandbytes only `type(m) is nn.Linear`
(integrations/bitsandbytes.py), torchao quantizes the weight of any `nn.Linear` in place (quantizer_torchao.py).
Embeddings, norms, gpt-oss's router and fused expert tensors are not `nn.Linear`: every scheme leaves them in the
model's dtype. For a `WeightLayout` this means: the linears of `first` and of the decoder layers are quantized,
those of `last` (the head) are not.
"""

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
