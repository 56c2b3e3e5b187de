"""What software one process measures with: the report each node (and the driver) gives at connect.

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
from functools import cache
from pathlib import Path

import kvsweep
from kvsweep.package_source import assigned_value, package_file
from kvsweep.testing.testing_config import REPORTED_VERSIONS_ENV, reported_overrides

ABSENT = "absent"
NO_GPU = "none"
QUANTIZATION_BACKENDS = ("optimum-quanto", "hqq", "bitsandbytes", "torchao")
# What must be the same on every node that runs cells, in the order a mismatch names them.
SOFTWARE = ("kvsweep", "python", "torch", "cuda", "transformers", *QUANTIZATION_BACKENDS, "nvidia_driver")
# The driver measures nothing; it plans with its own Transformers and sends its own kvsweep code (cells'
# arguments, registered strategies). A CPU-only torch there, beside CUDA builds on the nodes, is normal.
DRIVER_SOFTWARE = ("kvsweep", "transformers")
CPU_CELLS_SOFTWARE = tuple(f for f in SOFTWARE if f != "nvidia_driver")  # what a cell on the CPU measures with
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
        **{name: installed_version(name) for name in ("transformers", *QUANTIZATION_BACKENDS)},
        **nvidia_devices(),
    }
    overrides = reported_overrides()
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ValueError(f"{REPORTED_VERSIONS_ENV}: unknown field {unknown[0]!r}; fields: {', '.join(FIELDS)}")
    return {**report, **overrides}


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ABSENT


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
