"""What software one process measures with: the report each node (and the driver) gives at connect, and the check
a cell makes of its node where that node joined after connect (`SoftwareCheck`).

Read from the packages' metadata and sources, never by importing them: importing torch or
Transformers costs seconds, and this runs on every node at every sweep's start. `kvsweep` is a hash
of its installed sources, since `kvsweep.__version__` is a constant that does not change with the
code; torch is the build's own `__version__` (`2.13.0+cu128`: its CUDA build tag, which the wheel's
metadata may lack) and the CUDA it was built for.
"""

import contextlib
import hashlib
import importlib.metadata
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import kvsweep
from kvsweep.names import GPU_MODEL_PARAM, NODE_SOFTWARE_PARAM
from kvsweep.package_source import assigned_value, package_file
from kvsweep.testing.testing_config import REPORTED_VERSIONS_ENV, reported_overrides

ABSENT = "absent"
NO_GPU = "none"
QUANTIZATION_BACKENDS = ("optimum-quanto", "hqq", "bitsandbytes", "torchao")
# Packages a cell's numbers depend on beside Transformers: device_map placement and offloading (accelerate),
# GGUF checkpoints' dequantization (gguf); on GPUs, torch.compile's kernels (triton).
RUNTIME_PACKAGES = ("accelerate", "gguf")
GPU_PACKAGES = ("triton",)
CUDA_LIBRARIES = "cuda_libraries"  # the NVIDIA wheels torch loads (cuBLAS, cuDNN, NCCL, ...), each with its version
NOT_CUDA_LIBRARIES = ("nvidia-ml-py",)  # NVML's Python binding: a wheel named nvidia-*, no library torch loads
# What must be the same on every node that runs cells, in the order a mismatch names them.
SOFTWARE = (
    "kvsweep",
    "python",
    "torch",
    "cuda",
    CUDA_LIBRARIES,
    "transformers",
    *RUNTIME_PACKAGES,
    *GPU_PACKAGES,
    *QUANTIZATION_BACKENDS,
    "nvidia_driver",
)
# The driver measures nothing; it plans with its own Transformers and sends its own kvsweep code (cells'
# arguments, registered strategies). A CPU-only torch there, beside CUDA builds on the nodes, is normal.
DRIVER_SOFTWARE = ("kvsweep", "transformers")
GPU_ONLY = ("nvidia_driver", CUDA_LIBRARIES, *GPU_PACKAGES)
CPU_CELLS_SOFTWARE = tuple(f for f in SOFTWARE if f not in GPU_ONLY)  # what a cell on the CPU measures with
GPU = "gpu"  # a difference here is said, not refused: each cell records its node's
FIELDS = (*SOFTWARE, GPU)


def describe_software() -> dict[str, str]:
    """This process's report: every field of `FIELDS`, as text ("absent" for a package not installed).

    A node told to report otherwise (`KVSWEEP_TESTING_REPORTED_VERSIONS`, a test seam) does so here.
    """
    report = {
        "kvsweep": kvsweep_sources(),
        "python": platform.python_version(),
        "torch": torch_build(),
        "cuda": torch_cuda(),
        CUDA_LIBRARIES: cuda_libraries(),
        **{name: installed_version(name) for name in PACKAGES},
        **nvidia_devices(),
    }
    overrides = reported_overrides()
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ValueError(f"{REPORTED_VERSIONS_ENV}: unknown field {unknown[0]!r}; fields: {', '.join(FIELDS)}")
    return {**report, **overrides}


PACKAGES = ("transformers", *RUNTIME_PACKAGES, *GPU_PACKAGES, *QUANTIZATION_BACKENDS)


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ABSENT


def cuda_libraries() -> str:
    """`cublas-cu12 12.8.4.1, cudnn-cu12 9.10.2.21, ...`: every installed `nvidia-*` wheel (what a CUDA torch loads
    its libraries from) with its version; "none" where there is none (a CPU build, or CUDA from the system)."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-") and name not in NOT_CUDA_LIBRARIES:
            found[name.removeprefix("nvidia-")] = dist.version
    return ", ".join(f"{name} {version}" for name, version in sorted(found.items())) or NO_GPU


def torch_build() -> str:
    """`torch.__version__` as torch/version.py states it (with its build tag), else the wheel's metadata."""
    found = assigned_value(package_file("torch", "version.py"), "__version__")
    return str(found) if found else installed_version("torch")


def torch_cuda() -> str:
    """`torch.version.cuda`: the CUDA torch was built for ("none" for a CPU build, "absent" without torch)."""
    path = package_file("torch", "version.py")
    return ABSENT if path is None else str(assigned_value(path, "cuda") or "none")


@cache
def kvsweep_sources() -> str:
    """`0.1.0+src.<12 hex>`: the version and a hash of every .py file of the kvsweep package imported here.

    Computed once per process (a few milliseconds for ~170 files): the code does not change under it.
    """
    root = Path(kvsweep.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{kvsweep.__version__}+src.{digest.hexdigest()[:12]}"


def nvidia_devices() -> dict[str, str]:
    """The node's GPU model(s) and NVIDIA driver from NVML: every GPU of the host, whatever this process
    may see (NVML ignores `CUDA_VISIBLE_DEVICES`), without starting CUDA. "none" without NVML or GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver (a CPU node), or no pynvml
        return {GPU: NO_GPU, "nvidia_driver": NO_GPU}
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = {_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
        return {GPU: ", ".join(sorted(names)) or NO_GPU, "nvidia_driver": _text(pynvml.nvmlSystemGetDriverVersion())}
    except Exception as exc:  # NVML started but cannot answer: say so rather than guess
        return {GPU: f"unknown ({type(exc).__name__})", "nvidia_driver": f"unknown ({type(exc).__name__})"}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def fingerprint(report: Mapping[str, str]) -> str:
    """12 hex digits naming a node's `SOFTWARE` (not its GPU): cells with the same ran the same code."""
    text = "\n".join(f"{name}={report.get(name, '')}" for name in SOFTWARE)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class NodeSoftwareDiffers(RuntimeError):
    """A cell landed on a node the survey at connect did not see, whose software differs: not measured."""


@dataclass(frozen=True)
class SoftwareCheck:
    """What a cell compares its node with before it measures, where the survey at connect did not see that node
    (it joined later: an autoscaled node, one restarted): the value of each compared field that the surveyed nodes
    agree on. Empty `reference` (mixed versions allowed, or no survey): the cell only records its node's software.
    """

    surveyed: frozenset[str] = frozenset()  # node ids compared at connect: their cells check nothing again
    reference: Mapping[str, str] = field(default_factory=dict)
    enabled: bool = False  # False: the driver surveyed nothing (a test's scheduler), nothing is asked of a node

    def check_here(self, node_id: str, address: str) -> dict[str, str]:
        """The node's software fingerprint and GPU model for the cell's record ({} for a surveyed node, which the
        driver records); raises `NodeSoftwareDiffers`, one line naming node and fields, where it differs."""
        if not self.enabled or node_id in self.surveyed:
            return {}
        report = describe_software()
        differs = [
            f"{key} {report.get(key, '')} here, {value} on the checked nodes"
            for key, value in self.reference.items()
            if report.get(key) != value
        ]
        if differs:
            raise NodeSoftwareDiffers(
                f"node {address} (node {node_id[:8]}) joined after the sweep checked its nodes and runs different "
                f"software: {'; '.join(differs)}; not measured: give every node one environment "
                "(docs/cluster.md#one-environment-on-every-node) or set ray.allow_mixed_versions=true"
            )
        return {NODE_SOFTWARE_PARAM: fingerprint(report), GPU_MODEL_PARAM: report[GPU]}
