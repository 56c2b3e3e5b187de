"""The GPUs people run sweeps on, by their vendors' datasheet figures: what a forecast divides by off the cluster.

Peak FLOP/s is per dtype. bfloat16 and float16 run on the tensor cores: datasheets print the 2:4-sparsity figure
(marked *), twice the dense one, which no Transformers model reaches, so every tensor figure here is the
datasheet's halved (or its dense column where it prints one). float32 matmuls run on the CUDA cores (the FP32
row), because PyTorch leaves TF32 off (`torch.backends.cuda.matmul.allow_tf32` is False by default, and kvsweep
does not turn it on): 67 TFLOP/s on an H100 SXM against 989 for bf16, a float32 prefill ~15x slower. The dense
TF32 tensor figure is kept beside it, for what a float32 cell would get with TF32 on.

Memory bandwidth and capacity are the datasheet's (GB = 1e9 bytes, as `planner.device_memory_gb` counts: the
parts hold a little more, in GiB, less what the driver reserves). The host link is one direction of the
part's PCIe x16 (the datasheet's bidirectional figure halved: Gen4 32 GB/s, Gen5 64 GB/s), as
`planner.host_link_gbps` is one direction. Peaks, not sustained rates: `sustained.py` holds the shares a run gets.

Figures were cross-checked on CHECKED_ON against copies of the vendors' tables (resellers' and reference pages
quoting them), not the live PDFs: read the cited source again before relying on one.
"""

import re
from dataclasses import dataclass

from kvsweep.errors import ConfigError
from kvsweep.units import GB

TERA = 10**12  # FLOP/s per TFLOP/s
FLOAT32 = "float32"  # the dtype whose matmuls run on the CUDA cores (TF32 off); the others on the tensor cores
CHECKED_ON = "2026-12-07"

PCIE_GEN4_X16 = 32 * GB  # one direction; datasheets print 64 GB/s, both together
PCIE_GEN5_X16 = 64 * GB  # one direction; datasheets print 128 GB/s

A100_DATASHEET = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
H100_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"
L40S_PAGE = "https://www.nvidia.com/en-us/data-center/l40s/"
L4_PAGE = "https://www.nvidia.com/en-us/data-center/l4/"
A10_PAGE = "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"


@dataclass(frozen=True)
class Gpu:
    key: str  # what `planner.gpu` names it by
    name: str
    bf16_flops: float  # peak dense bf16 tensor FLOP/s, without sparsity (float16: the same on these parts)
    memory_bandwidth: float  # device memory, bytes/s
    memory_bytes: int
    host_link: float  # PCIe x16 of the part's generation, one direction, bytes/s
    source: str  # the vendor's datasheet or product page the figures are from
    published: str  # "YYYY-MM": when the vendor published them (the part's launch, or the datasheet revision cited)
    approximate: bool = False  # a figure the vendor does not publish, taken from elsewhere: `note` says which
    note: str = ""
    fp32_flops: float = 0.0  # peak FP32 FLOP/s of the CUDA cores (no tensor cores): a float32 matmul, TF32 off
    tf32_flops: float = 0.0  # peak dense TF32 tensor FLOP/s: a float32 matmul with TF32 on (not kvsweep's default)

    def flops(self, dtype: str) -> float:
        """The peak a matmul of `dtype` runs at as kvsweep runs it: tensor cores for 16-bit types, CUDA cores for
        float32 (TF32 off)."""
        return self.fp32_flops if dtype == FLOAT32 else self.bf16_flops


def _sheet(
    key: str,
    name: str,
    tflops: tuple[float, float, float],
    gbps: float,
    gb: int,
    link: float,
    source: str,
    published: str,
    approximate: bool = False,
    note: str = "",
) -> Gpu:
    """An entry in the datasheet's own units: TFLOP/s as (dense bf16 tensor, FP32, dense TF32 tensor), memory GB/s
    and GB."""
    bf16, fp32, tf32 = (t * TERA for t in tflops)
    return Gpu(key, name, bf16, gbps * GB, gb * GB, link, source, published, approximate, note, fp32, tf32)


GEN4, GEN5 = PCIE_GEN4_X16, PCIE_GEN5_X16

GPUS: tuple[Gpu, ...] = (
    # A100: one datasheet for all four; bf16 312 TF dense (624 with sparsity), FP32 19.5, TF32 156 dense (312*).
    _sheet("a100-40gb", "NVIDIA A100 40GB SXM4", (312, 19.5, 156), 1555, 40, GEN4, A100_DATASHEET, "2021-06"),
    _sheet("a100-80gb", "NVIDIA A100 80GB SXM4", (312, 19.5, 156), 2039, 80, GEN4, A100_DATASHEET, "2021-06"),
    _sheet("a100-40gb-pcie", "NVIDIA A100 40GB PCIe", (312, 19.5, 156), 1555, 40, GEN4, A100_DATASHEET, "2021-06"),
    _sheet("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", (312, 19.5, 156), 1935, 80, GEN4, A100_DATASHEET, "2021-06"),
    # H100: 1,979 TF with sparsity (SXM) is the whitepaper's 1,978.9, so 989.4 dense; PCIe 1,513 -> 756.5;
    # NVL 1,671 -> 835.5. FP32 67 / 51 / 60; TF32 989* / 756* / 835* -> 494.7 / 378 / 417.5 dense. The PCIe card
    # is in the 2022 revisions of the datasheet (and its product brief PB-11133-001, Nov 2022); later revisions
    # list the NVL in its place.
    _sheet("h100-sxm", "NVIDIA H100 SXM5 80GB", (989.4, 67, 494.7), 3350, 80, GEN5, H100_DATASHEET, "2022-03"),
    _sheet("h100-pcie", "NVIDIA H100 PCIe 80GB", (756.5, 51, 378), 2000, 80, GEN5, H100_DATASHEET, "2022-03"),
    _sheet("h100-nvl", "NVIDIA H100 NVL 94GB", (835.5, 60, 417.5), 3900, 94, GEN5, H100_DATASHEET, "2023-03"),
    # H200: the H100's silicon and clocks with HBM3e: the same 1,979 TF with sparsity (SXM), 1,671 (NVL), and the
    # same FP32 (67, 60) and TF32 (989*, 835*).
    _sheet("h200-sxm", "NVIDIA H200 SXM 141GB", (989.4, 67, 494.7), 4800, 141, GEN5, H200_PAGE, "2023-11"),
    _sheet("h200-nvl", "NVIDIA H200 NVL 141GB", (835.5, 60, 417.5), 4800, 141, GEN5, H200_PAGE, "2024-11"),
    # L40S: the page prints a dense column: 362.05 TF bf16 (733 with sparsity); FP32 91.6; TF32 183 (366*).
    _sheet("l40s", "NVIDIA L40S 48GB", (362.05, 91.6, 183), 864, 48, GEN4, L40S_PAGE, "2023-08"),
    # L4: 242 TF bf16 with sparsity -> 121 dense; FP32 30.3; TF32 120* -> 60.
    _sheet("l4", "NVIDIA L4 24GB", (121, 30.3, 60), 300, 24, GEN4, L4_PAGE, "2023-03"),
    # A10: 125 TF bf16 is the dense figure (250 with sparsity); FP32 31.2; TF32 62.5 (125*).
    _sheet("a10", "NVIDIA A10 24GB", (125, 31.2, 62.5), 600, 24, GEN4, A10_PAGE, "2021-04"),
    _sheet(
        "a10g",
        "NVIDIA A10G 24GB (AWS G5)",
        (70, 35, 35),
        600,
        24,
        GEN4,
        A10_PAGE,
        "2021-04",
        approximate=True,
        note=(
            "AWS's variant of the A10: memory and bandwidth are the A10's (24 GB GDDR6, 600 GB/s; "
            "https://aws.amazon.com/ec2/instance-types/g5/), but neither NVIDIA nor AWS publishes its tensor "
            "throughput. 70 TF dense bf16 is Baseten's figure "
            "(https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/), consistent with 80 SMs at "
            "~1.71 GHz running bf16 with fp32 accumulation at half the A10's per-SM rate (80 x 1.71e9 x 512 FLOP). "
            "FP32 35 TF is the same clock on 128 FP32 lanes per SM (80 x 1.71e9 x 256 FLOP); TF32 taken as half "
            "the bf16 rate, as on every other part here."
        ),
    ),
)

_BY_KEY = {gpu.key: gpu for gpu in GPUS}


def gpu_by_key(key: str) -> Gpu:
    """The entry `planner.gpu` names; a `ConfigError` in one line (the key and the known ones) for any other."""
    gpu = _BY_KEY.get(key.strip().lower())
    if gpu is None:
        raise ConfigError(f"unknown GPU {key!r} for planner.gpu; known: {', '.join(_BY_KEY)}")
    return gpu


# What a driver calls each part (NVML's and torch.cuda.get_device_name's names), as the tokens that identify it; a
# name with a capacity token ("80gb") must also match the entry's capacity, so a variant not in the table (an H100
# SXM5 64GB, an A800) is not mistaken for one that is. First match wins.
_DRIVER_TOKENS: tuple[tuple[frozenset[str], str], ...] = tuple(
    (frozenset(tokens.split()), key)
    for tokens, key in (
        ("h100 nvl", "h100-nvl"),
        ("h100 pcie", "h100-pcie"),
        ("h100 hbm3", "h100-sxm"),  # "NVIDIA H100 80GB HBM3": the SXM5 part
        ("h100 sxm", "h100-sxm"),
        ("h200 nvl", "h200-nvl"),
        ("h200", "h200-sxm"),  # "NVIDIA H200": the SXM part
        ("a100 sxm 80gb", "a100-80gb"),
        ("a100 sxm 40gb", "a100-40gb"),
        ("a100 pcie 80gb", "a100-80gb-pcie"),
        ("a100 pcie 40gb", "a100-40gb-pcie"),
        ("l40s", "l40s"),
        ("l4", "l4"),
        ("a10g", "a10g"),
        ("a10", "a10"),
    )
)
_CAPACITY = re.compile(r"(\d+)gb")


def detect(driver_name: str) -> Gpu | None:
    """The entry for the GPU a driver names ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"), or None: a part
    not in the table, or a MIG slice (a fraction of the GPU, whose whole-GPU figures would overstate it)."""
    tokens = _tokens(driver_name)
    if "mig" in tokens:
        return None
    capacities = {int(m.group(1)) for token in tokens if (m := _CAPACITY.fullmatch(token))}
    for required, key in _DRIVER_TOKENS:
        gpu = _BY_KEY[key]
        if required <= tokens and all(c * GB == gpu.memory_bytes for c in capacities):
            return gpu
    return None


def _tokens(driver_name: str) -> frozenset[str]:
    """ "NVIDIA A100-SXM4-80GB" -> {a100, sxm, 80gb}: lower case, split at spaces, hyphens and underscores, the
    vendor's name dropped, "sxm4"/"sxm5" read as "sxm"."""
    words = re.split(r"[\s\-_]+", driver_name.strip().lower())
    return frozenset("sxm" if w.startswith("sxm") else w for w in words if w and w not in ("nvidia", "tesla"))
