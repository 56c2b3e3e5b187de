"""Weight quantization schemes (`grid.weights`): what each needs (a package, CUDA, a dtype), why a cell cannot use
one, and the exact bytes a model's weights take under it, counted from a `WeightLayout` without building the model
(nor importing torch), so that the planner can size a cell before anything loads.

Transformers picks the linears a scheme quantizes (`quantize_weights.py`): those of `first` and of the decoder
layers, never the head's; whatever is not an `nn.Linear` stays in the model's dtype. Bytes per `in` x `out` linear
(a bias stays in the dtype):

- quanto int8: int8 `out*in`, a scale per row in the dtype, and two float32 scalars `input_scale`/`output_scale`
  (`QuantoQuantize` sets them with `torch.ones(...)`: float32 whatever the dtype).
- quanto int4: group `g` from `quanto_group`, `rows` = `out*in/g` (or `out`); a scale and a shift per row in the
  dtype (`MaxOptimizer`); `PackedTensor` packs two weights a byte along rows: `ceil(rows/2) * cols`. The tinygemm
  (bfloat16) and AWQ (float16 on CUDA) re-packings at `g == 128` store the same bytes whenever `rows` is even, as
  in every real model's shapes. Plus the same two float32 scalars.
- bitsandbytes int8 (`Int8Params`): int8 `out*in` and a float32 scale (`SCB`) per row.
- bitsandbytes NF4 (`Params4bit`, no double quantization): `ceil(out*in/2)`, a float32 absmax per block of 64
  weights, and the weight's 16-entry float32 NF4 code.
- torchao int4 (`Int4TilePackedTo4dTensor`, tinygemm, bfloat16 only): `out` padded to a multiple of 8 and `in` to
  1024, half a byte per padded weight, scale and zero point in one bfloat16 `(in_pad/128, out_pad, 2)`.

The quanto figures are checked against built models on CPU (tests/test_weight_schemes.py); the bitsandbytes and
torchao ones are read from those libraries' sources, for a GPU run to confirm with `stored_bytes`.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvsweep.models.weight_layout import Block, Linear, WeightLayout

NONE = "none"

NF4_BLOCK = 64  # bitsandbytes' 4-bit block (Params4bit's default; Transformers does not pass one)
TORCHAO_GROUP = 128


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


# a QLinear's input_scale and output_scale: float32 scalars (Transformers' QuantoQuantize)
QUANTO_SCALAR_BUFFERS = 2 * 4
NF4_CODE_BYTES = 16 * 4  # the 16 NF4 levels, float32, in each weight's quant state
TORCHAO_IN_PAD, TORCHAO_OUT_PAD = 1024, 8  # Int4TilePackedTo4dTensor pads in_features and out_features to these


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


def copying_rows(scheme: WeightScheme | None, device_kind: str, dtype: str) -> int:
    """The fewest rows (tokens in one matmul) at which the scheme's matmul first writes its weights out in the
    model's dtype and multiplies that copy; 0 where its kernel reads the stored bytes at any row count. Read from
    the backends' sources, for real models' shapes (in and out features multiples of 128):

    - quanto int8: on a CPU in bfloat16, `_weight_int8pack_mm` reads the int8 weights; elsewhere `qbytes_mm`
      multiplies the scales into the weights first (`output_scales * weights`), a copy in the dtype, every call.
    - quanto int4: tinygemm (bfloat16, CPU or CUDA) and AWQ (float16, CUDA) read the packed weights; in float32,
      or float16 on a CPU, the weights are dequantized first.
    - bitsandbytes NF4: one row runs `gemv_4bit` on the packed weights; more rows dequantize first.
    - bitsandbytes int8 and torchao int4: int8 and tinygemm kernels read what is stored.
    """
    if scheme is None or scheme.backend == "torchao" or (scheme.backend == "bnb" and scheme.bits == 8):
        return 0
    if scheme.backend == "bnb":
        return 2
    if scheme.bits == 8:
        return 0 if device_kind == "cpu" and dtype == "bfloat16" else 1
    kernel = dtype == "bfloat16" or (dtype == "float16" and device_kind == "cuda")
    return 0 if kernel else 1


def quantized_weights(layout: WeightLayout) -> int:
    """The weight elements a scheme quantizes: every linear's but the head's (`layout_bytes`)."""
    return sum(
        linear.count * linear.in_features * linear.out_features
        for b in (layout.first, *layout.layers)
        for linear in b.linears
    )
