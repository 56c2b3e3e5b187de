"""Weight quantization schemes (`grid.weights`): the names a sweep may ask for, what each needs (a package, CUDA,
a dtype), and why a cell cannot use one.

The rest of the idea lives beside it: what a scheme stores, counted from a model's shapes (`weight_bytes.py`);
applying a scheme to a model (`quantize_weights.py`); what a built model really stores (`stored_bytes.py`);
checkpoints quantized already (`prequantized.py`).
"""

from collections.abc import Callable
from dataclasses import dataclass

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
