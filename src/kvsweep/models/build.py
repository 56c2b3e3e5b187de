"""A cell's model, built in the cell's dtype on its device, or placed over its GPUs exactly as the planner split it.

Presets get seeded random weights without transformers' default init (which walks every module with slow
per-layer initialisers): created straight on the target device with init skipped, then one fast seeded draw.

Over several GPUs (docs/cluster.md): `models/sharding.py` picks each GPU's decoder layers; this module turns that
into a device map over the model's own module names (the decoder's layer list found by its length) and loads it: a
checkpoint through `from_pretrained(device_map=...)`, a preset by creating each weight on its GPU (a 70B preset
never passes through host memory) and dispatching it with Accelerate's hooks, which move the hidden state between
GPUs. The cache needs nothing: Transformers creates each cache layer on the device of its layer's keys. The devices
are the caller's list, so the whole path runs on a CPU machine with `["cpu", "cpu"]`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.initialization import no_init_weights

from kvsweep.models.gguf_source import dequantizing
from kvsweep.models.quantize_weights import quantization_config, quantize_built_model
from kvsweep.models.resolve import ModelRef, load_config, meta_model, pretrained_args
from kvsweep.models.sharding import GpuLoad
from kvsweep.models.weight_layout import decoder_layers
from kvsweep.models.weight_schemes import WeightScheme, weight_scheme
from kvsweep.units import DTYPE_BYTES

INIT_STD = 0.02


def torch_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a grid dtype name (the names and their byte sizes live in `kvsweep.units`)."""
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


def device_map(model: nn.Module, layers_name: str, loads: Sequence[GpuLoad], devices: Sequence[str]) -> dict[str, str]:
    """Every top-level piece of the model with its device: each layer where `loads` put it, what comes
    before the layer list with the first device, what comes after with the last (or the first, when it
    holds a weight tied to one before the list)."""
    placed: dict[str, str] = {f"{layers_name}.{i}": devices[load.gpu] for load in loads for i in load.layers}
    pieces: list[tuple[str, set[int], bool]] = []  # (name, its tensors, registered before the layer list)
    path = layers_name.split(".")
    parent: nn.Module = model
    for depth, step in enumerate(path):
        prefix = ".".join(path[:depth])
        seen_list = False
        for name, child in parent.named_children():
            if name == step:
                seen_list = True
                continue
            tensors = {id(t) for t in (*child.parameters(), *child.buffers())}
            if tensors:
                pieces.append((f"{prefix}.{name}" if prefix else name, tensors, not seen_list))
        parent = parent.get_submodule(step)
    before = set().union(*(tensors for _, tensors, is_before in pieces if is_before))
    for name, tensors, is_before in pieces:
        placed[name] = devices[0] if is_before or tensors & before else devices[-1]
    return placed


def materialize_preset(model: nn.Module, placed: dict[str, str], dtype: torch.dtype) -> None:
    """Give every weight of a model built without storage (`init_empty_weights`) an uninitialised tensor on
    its device, then tie the tied ones again (their second copy is dropped)."""
    from accelerate.utils import set_module_tensor_to_device

    for name, device in placed.items():
        module = model.get_submodule(name)
        for tensor_name, param in list(module.named_parameters()):
            if param.device.type == "meta":
                value = torch.empty(param.shape, dtype=dtype, device=device)
                set_module_tensor_to_device(module, tensor_name, device, value=value)
    model.tie_weights()


def dispatch(model: Any, placed: dict[str, str]) -> Any:
    """Accelerate's hooks on every placed module: each moves its inputs to its own device (the cache stays
    where Transformers put it: `past_key_values` is skipped, as `from_pretrained(device_map=...)` does)."""
    from accelerate import dispatch_model

    skip = getattr(model, "_skip_keys_device_placement", None)
    return dispatch_model(model, device_map=placed, skip_keys=skip, force_hooks=True)


@dataclass(frozen=True)
class Split:
    """A model over several devices: the devices, in GPU order, and each one's layers (`split_layers`)."""

    devices: tuple[str, ...]
    loads: tuple[GpuLoad, ...]


def build_split_model(
    ref: ModelRef, dtype: torch.dtype, seed: int, split: Split, trust_remote_code: bool = False, weights: str = "none"
) -> tuple[PreTrainedModel, dict[str, str]]:
    """The model placed over `split.devices`, and the device map it was placed by (`weights`: as `build_model`)."""
    scheme = weight_scheme(weights)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config = load_config(ref, trust_remote_code)
    layers = config.get_text_config(decoder=True).num_hidden_layers
    if ref.kind != "preset":
        meta = meta_model(config)
        placed = device_map(meta, decoder_layers(meta, layers), split.loads, split.devices)
        source, options = load_options(ref, scheme, dtype)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, device_map=placed, trust_remote_code=trust_remote_code, **options
        )
        if len(set(placed.values())) == 1:  # the CPU seam: Transformers adds hooks only across devices
            model = dispatch(model, placed)
        return model, placed
    with init_empty_weights(include_buffers=False):  # weights without storage; buffers (rotary) computed
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    placed = device_map(model, decoder_layers(model, layers), split.loads, split.devices)
    materialize_preset(model, placed, dtype)
    fill_random_weights(model, seed)
    if scheme is not None:  # each layer quantized on its own device
        quantize_built_model(model, scheme)
    return dispatch(model, placed), placed
