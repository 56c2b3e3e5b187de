"""Proves that the installed torch really starts CUDA on this node, before any sweep is spent on it.

A plain process, without `PYTORCH_NVML_BASED_CUDA_CHECK` (that shortcut only asks NVML whether a device
exists, which a torch built for a newer CUDA than the driver's still passes): `import torch`,
`torch.cuda.init()` and a tiny allocation and kernel. One line either way; on failure it names the
driver, the driver's CUDA version and the torch build, and exits 1. Importing torch is part of the
check: a torch whose libraries do not load (a missing libcudnn, CUDA wheels another build left behind)
fails here in the same one line, its build then read from the installed package's metadata.

    nvidia-smi | python scripts/cuda_starts.py
"""

import os
import sys
from collections.abc import Callable
from importlib import metadata

from torch_for_driver import Driver, read_driver


def start_cuda() -> str:
    """Import torch, initialise CUDA for real and run one kernel; the device's name."""
    import torch  # here, not at the top: a torch that cannot import is what this check reports

    torch.cuda.init()
    two = (torch.ones(1, device="cuda") + 1).item()  # .item() waits for the kernel
    if two != 2.0:
        raise RuntimeError(f"a CUDA kernel computed 1 + 1 = {two}")
    return torch.cuda.get_device_name(0)


def torch_build() -> str:
    """The torch this process imported, or (when it could not) the one pip installed."""
    torch = sys.modules.get("torch")  # a failed import leaves no module behind
    if torch is not None and hasattr(torch, "version"):
        return f"torch {torch.__version__} (built for CUDA {torch.version.cuda or 'none: a CPU-only build'})"
    try:
        return f"torch {metadata.version('torch')} (installed, not imported)"
    except metadata.PackageNotFoundError:
        return "torch not installed"


def check(driver: Driver, start: Callable[[], str] = start_cuda) -> tuple[bool, str]:
    """Whether CUDA starts, and the one line to print."""
    try:
        device = start()
    except Exception as exc:  # whatever torch raises, an ImportError included: what was tried on what
        first = next(iter(str(exc).strip().splitlines()), "")[:300]
        return False, f"CUDA does not start: {driver.describe()}, {torch_build()}: {type(exc).__name__}: {first}"
    return True, f"CUDA starts on {device}: {torch_build()}, {driver.describe()}"


def main() -> int:
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # torch reads it at each availability check
    ok, line = check(read_driver(sys.stdin.read()))
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
