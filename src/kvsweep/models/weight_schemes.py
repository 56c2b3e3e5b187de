"""Weight quantization schemes (`grid.weights`): what each needs, what it stores, and checkpoints quantized already.

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

Bytes each backend stores for one `in` x `out` linear (`linear_bytes`; a bias stays in the model's dtype):

- quanto int8 (`WeightQBytesTensor`): int8 data `out*in`, a scale per output row in the model's dtype, and the
  QLinear's two float32 scalar buffers `input_scale`/`output_scale` (Transformers' `QuantoQuantize` sets them
  with `torch.ones(...)`, float32 whatever the model's dtype).
- quanto int4: the group `g` along `in` is 128, else the largest of 96, 64, 32 dividing `in`; none when
  `in <= 128` or none divides (then one group per row) (`QModuleMixin.__init__`). `rows` = number of groups
  (`out*in/g`, or `out`); a scale and a shift per group in the model's dtype (`MaxOptimizer`); data two weights
  a byte, `PackedTensor` packs along rows: `ceil(rows/2) * cols` bytes. bfloat16 with `g == 128` is re-packed for
  tinygemm (`TinyGemmWeightQBitsTensor`: data `out*in/2` bytes, scale and shift in one `(in/g, out, 2)` tensor),
  float16 on CUDA with `g == 128` for AWQ (data `out*in/2`, scale and shift `(in/g, out)` each): the same bytes
  whenever `rows` is even, which every real model's shapes are. Plus the same two float32 scalars.
- bitsandbytes int8 (`Int8Params`, `int8_vectorwise_quant`): int8 `out*in` and a float32 scale (`SCB`) per row.
- bitsandbytes NF4 (`Params4bit`, `quantize_4bit`, no double quantization, block 64): `ceil(out*in/2)` bytes, a
  float32 absmax per block of 64 weights, and the 16-entry float32 NF4 code of the weight's quant state.
- torchao int4 (`Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")`, tinygemm on CUDA,
  bfloat16 only): `out` padded to a multiple of 8 and `in` to a multiple of 1024 (`Int4TilePackedTo4dTensor`),
  data half a byte per padded weight, scale and zero point packed in one bfloat16 `(in_pad/128, out_pad, 2)`.

The quanto figures are checked against built models on CPU (tests/test_weight_schemes.py); the bitsandbytes and
torchao ones are written from those libraries' sources (neither runs on this CPU-only machine) and are for a GPU
run to confirm with `stored_bytes`.
"""

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kvsweep.models.weight_layout import Block, Linear, WeightLayout

NONE = "none"

# a QLinear's input_scale and output_scale: float32 scalars (Transformers' QuantoQuantize)
QUANTO_SCALAR_BUFFERS = 2 * 4
NF4_BLOCK = 64  # bitsandbytes' 4-bit block (Params4bit's default; Transformers does not pass one)
NF4_CODE_BYTES = 16 * 4  # the 16 NF4 levels, float32, in each weight's quant state
TORCHAO_GROUP = 128
TORCHAO_IN_PAD, TORCHAO_OUT_PAD = 1024, 8  # Int4TilePackedTo4dTensor pads in_features and out_features to these


@dataclass(frozen=True)
class WeightScheme:
    name: str  # "quanto-int8"
    backend: str  # "quanto" | "bnb" | "torchao"
    bits: int
    package: str  # importable module that must be installed
    install_hint: str  # "pip install optimum-quanto"
    cuda_only: bool
    group_size: int | None = None  # largest group of weights sharing a scale (quanto int4: 128 or less)
    dtypes: tuple[str, ...] = ()  # the model dtypes it supports; empty: all


WEIGHT_SCHEMES: dict[str, WeightScheme] = {
    s.name: s
    for s in (
        WeightScheme("quanto-int8", "quanto", 8, "optimum.quanto", "pip install optimum-quanto", False),
        WeightScheme("quanto-int4", "quanto", 4, "optimum.quanto", "pip install optimum-quanto", False, 128),
        WeightScheme("bnb-nf4", "bnb", 4, "bitsandbytes", "pip install bitsandbytes", True, NF4_BLOCK),
        WeightScheme("bnb-int8", "bnb", 8, "bitsandbytes", "pip install bitsandbytes", True),
        # tinygemm's int4 kernel: CUDA (compute capability 8.0+) and bfloat16 only
        WeightScheme(
            "torchao-int4", "torchao", 4, "torchao", "pip install torchao", True, TORCHAO_GROUP, ("bfloat16",)
        ),
    )
}


def weight_scheme(name: str) -> WeightScheme | None:
    """The scheme named `name`; None for `none`; ValueError (one line) for a name that is neither."""
    if name == NONE:
        return None
    if name not in WEIGHT_SCHEMES:
        raise ValueError(f"unknown weight quantization {name!r}; allowed: {', '.join([NONE, *WEIGHT_SCHEMES])}")
    return WEIGHT_SCHEMES[name]


def scheme_problem(name: str, device: str, is_installed: Callable[[str], bool], dtype: str | None = None) -> str | None:
    """Why cells with these weights cannot run on `device` (`cpu`, `cuda`, `cuda:1`) in `dtype` (when given),
    one line, or None. The device comes first: installing a package would not make bitsandbytes run on a CPU."""
    scheme = weight_scheme(name)
    if scheme is None:
        return None
    kind = device.split(":")[0]
    if scheme.cuda_only and kind != "cuda":
        return f"{name} weights need CUDA; cells run on {device}"
    if dtype is not None and scheme.dtypes and dtype not in scheme.dtypes:
        return f"{name} weights need {' or '.join(scheme.dtypes)}; cells use {dtype}"
    if not is_installed(scheme.package):
        return f"{name} weights need the '{scheme.package}' package ({scheme.install_hint})"
    return None


# --- exact bytes ---------------------------------------------------------------------------------------------------


def quanto_group(in_features: int) -> int | None:
    """optimum-quanto's int4 group along the input features (`QModuleMixin.__init__`): 128, else the largest of
    96, 64, 32 dividing them; None (one group per output row) when there are at most 128 or none divides."""
    group = 128
    if in_features <= group:
        return None
    while in_features % group and group > 32:
        group -= 32
    return group if in_features % group == 0 else None


def linear_bytes(scheme: WeightScheme | None, linear: Linear, dtype_bytes: int) -> int:
    """Exact stored bytes of `linear.count` such nn.Linear modules under `scheme` (None: left in the model's
    dtype), weights, scales, zero points, biases and per-module buffers as the backend stores them."""
    bias = linear.out_features * dtype_bytes if linear.bias else 0
    return linear.count * (_weight_bytes(scheme, linear.in_features, linear.out_features, dtype_bytes) + bias)


def _weight_bytes(scheme: WeightScheme | None, n_in: int, n_out: int, dtype_bytes: int) -> int:
    weights = n_in * n_out
    if scheme is None:
        return weights * dtype_bytes
    if scheme.backend == "quanto" and scheme.bits == 8:
        return weights + n_out * dtype_bytes + QUANTO_SCALAR_BUFFERS
    if scheme.backend == "quanto":
        group = quanto_group(n_in)
        rows, cols = (n_out, n_in) if group is None else (weights // group, group)
        return math.ceil(rows / 2) * cols + 2 * rows * dtype_bytes + QUANTO_SCALAR_BUFFERS
    if scheme.backend == "bnb" and scheme.bits == 8:
        return weights + n_out * 4
    if scheme.backend == "bnb":
        return (weights + 1) // 2 + math.ceil(weights / NF4_BLOCK) * 4 + NF4_CODE_BYTES
    if scheme.backend == "torchao":
        padded_in = math.ceil(n_in / TORCHAO_IN_PAD) * TORCHAO_IN_PAD
        padded_out = math.ceil(n_out / TORCHAO_OUT_PAD) * TORCHAO_OUT_PAD
        return padded_in * padded_out // 2 + (padded_in // TORCHAO_GROUP) * padded_out * 2 * 2
    raise ValueError(f"no byte formula for {scheme.name}")


def block_bytes(block: Block, scheme: WeightScheme | None, dtype_bytes: int, quantized: bool = True) -> int:
    """A block's bytes: its linears under `scheme` (in the dtype when `quantized` is off: the head), the rest
    (embeddings, norms, experts...) in the dtype."""
    linears = sum(linear_bytes(scheme if quantized else None, linear, dtype_bytes) for linear in block.linears)
    return linears + block.other_elements * dtype_bytes


def layout_bytes(layout: WeightLayout | Block, scheme: WeightScheme | None, dtype_bytes: int) -> int:
    """A model's (or one block's, its linears quantized) weight bytes under `scheme`. Of a whole model the linears
    of `last` stay in the dtype: Transformers never quantizes the output embeddings nor the last module."""
    if isinstance(layout, Block):
        return block_bytes(layout, scheme, dtype_bytes)
    inner = sum(block_bytes(b, scheme, dtype_bytes) for b in (layout.first, *layout.layers))
    return inner + block_bytes(layout.last, scheme, dtype_bytes, quantized=False)


# --- checkpoints quantized already ---------------------------------------------------------------------------------

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


# --- quantizing ---------------------------------------------------------------------------------------------------


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


# --- what a built model really stores ------------------------------------------------------------------------------


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
