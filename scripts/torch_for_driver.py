"""Which PyTorch CUDA build a node's NVIDIA driver can run, and whether an interpreter is new enough.

`scripts/gpu_smoke.sh` runs this before kvsweep's virtual environment exists, under whatever Python the
node has: so it uses only the standard library and no syntax newer than Python 3.7, and an old
interpreter can still say, in one line, that it is too old.

The rule for the build: CUDA's minor-version compatibility lets a build for CUDA X.y run on any driver
that supports X.0 or newer (12.x builds need driver >= 525.60.13, 13.x builds >= 580.65.06), and a newer
major driver runs older major builds. So a driver runs every build whose CUDA major is at most its own,
and the newest of those is chosen among the builds every current PyTorch release (2.12 to 2.14)
publishes as stable: CUDA 12.6 and 13.0.

    python scripts/torch_for_driver.py python          # exit 0: this interpreter will do
    nvidia-smi | python scripts/torch_for_driver.py choose   # the index URL, then one line saying why

`choose` honours TORCH_INDEX_URL (a mirror, or a build of your choosing), named as the reason.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

PYTORCH_INDEX = "https://download.pytorch.org/whl"
# (index tag, CUDA version it was built with), oldest first: stable in every release from 2.12 to 2.14.
BUILDS = (("cu126", (12, 6)), ("cu130", (13, 0)))
# The first driver of each CUDA version (NVIDIA's toolkit release notes), newest first: for an nvidia-smi
# that prints no "CUDA Version", and to name the driver a build's major needs.
DRIVER_CUDA = (
    ("580.65.06", (13, 0)),
    ("575.51.03", (12, 9)),
    ("570.26", (12, 8)),
    ("560.28.03", (12, 6)),
    ("550.54.14", (12, 4)),
    ("535.54.03", (12, 2)),
    ("525.60.13", (12, 0)),
    ("520.61.05", (11, 8)),
    ("450.36.06", (11, 0)),
)
HEADER_CUDA = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
HEADER_DRIVER = re.compile(r"Driver Version:\s*(\d+(?:\.\d+)+)")
BARE_DRIVER = re.compile(r"^\s*(\d+\.\d+(?:\.\d+)?)\s*$", re.M)  # --query-gpu=driver_version --format=csv,noheader
REQUIRES_PYTHON = re.compile(r"""requires-python\s*=\s*["']>=\s*(\d+)\.(\d+)""")


class Driver(NamedTuple):
    version: str | None  # "550.54.14"
    cuda: tuple[int, int] | None  # the newest CUDA it supports
    seen: str = ""  # the first line nvidia-smi printed, to quote when nothing could be read

    def describe(self) -> str:
        cuda = f"{self.cuda[0]}.{self.cuda[1]}" if self.cuda else "unknown"
        return f"driver {self.version or 'unknown'} (CUDA {cuda})"


class Choice(NamedTuple):
    index_url: str
    reason: str  # one line


class NoBuild(Exception):
    """No build can be chosen for this driver; the message is the one line to show."""


def read_driver(nvidia_smi: str) -> Driver:
    """The driver version and its CUDA version from `nvidia-smi`'s header, or from a bare
    `--query-gpu=driver_version` line (the CUDA version then comes from DRIVER_CUDA)."""
    found = HEADER_DRIVER.search(nvidia_smi) or BARE_DRIVER.search(nvidia_smi)
    version = found.group(1) if found else None
    seen = next((line.strip() for line in nvidia_smi.splitlines() if line.strip()), "")[:120]
    cuda = HEADER_CUDA.search(nvidia_smi)
    if cuda:
        return Driver(version, (int(cuda.group(1)), int(cuda.group(2))), seen)
    return Driver(version, cuda_of_driver(version) if version else None, seen)


def cuda_of_driver(version: str) -> tuple[int, int] | None:
    return next((cuda for first, cuda in DRIVER_CUDA if _numbers(version) >= _numbers(first)), None)


def first_driver(major: int) -> str:
    """The oldest driver that runs CUDA `major`.x builds."""
    return next(first for first, cuda in DRIVER_CUDA if cuda == (major, 0))


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def choose_build(driver: Driver, index_url: str = "") -> Choice:
    """The newest build the driver runs (see the module's docstring), or `index_url` when one is given."""
    if index_url:
        return Choice(index_url, f"torch from TORCH_INDEX_URL={index_url}, as set ({driver.describe()})")
    if driver.cuda is None:
        raise NoBuild(
            f"could not read the driver's CUDA version from nvidia-smi (it printed {driver.seen or 'nothing'!r}); "
            "set TORCH_INDEX_URL to the PyTorch index to install from"
        )
    runnable = [(tag, cuda) for tag, cuda in BUILDS if cuda[0] <= driver.cuda[0]]
    if not runnable:
        oldest = BUILDS[0][1]
        raise NoBuild(
            f"{driver.describe()} is too old for PyTorch's current builds (the oldest, CUDA {oldest[0]}.{oldest[1]}, "
            f"needs driver >= {first_driver(oldest[0])}): update the driver, or set TORCH_INDEX_URL and TORCH_SPEC "
            "to an older torch build"
        )
    tag, cuda = runnable[-1]
    why = []
    if cuda[0] == driver.cuda[0] and cuda > driver.cuda:
        why.append(f"a CUDA {cuda[0]}.x build runs on any {cuda[0]}.x driver")
    why += [f"{t} needs driver >= {first_driver(c[0])}" for t, c in BUILDS if c[0] > driver.cuda[0]]
    return Choice(
        f"{PYTORCH_INDEX}/{tag}",
        f"torch build {tag} (CUDA {cuda[0]}.{cuda[1]}) for {driver.describe()}: "
        + ("; ".join(why) or "the newest build PyTorch publishes"),
    )


def required_python(pyproject: str) -> tuple[int, int]:
    found = REQUIRES_PYTHON.search(pyproject)
    if not found:
        raise ValueError("pyproject.toml names no requires-python '>=X.Y'")
    return int(found.group(1)), int(found.group(2))


def python_verdict(name: str, version: tuple[int, ...], required: tuple[int, int]) -> tuple[bool, str]:
    """Whether an interpreter of `version` will do, and one line naming it and what it has."""
    have = ".".join(str(part) for part in version[:3])
    if tuple(version[:2]) >= required:
        return True, f"{name} is Python {have}"
    return False, f"{name} is Python {have}, older than the {required[0]}.{required[1]} pyproject.toml requires"


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "python":
        pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
        ok, line = python_verdict(sys.executable, tuple(sys.version_info), required_python(pyproject))
        print(line)
        return 0 if ok else 1
    if command == "choose":
        try:
            choice = choose_build(read_driver(sys.stdin.read()), os.environ.get("TORCH_INDEX_URL", ""))
        except NoBuild as problem:
            print(problem, file=sys.stderr)
            return 1
        print(choice.index_url)
        print(choice.reason)
        return 0
    print("usage: torch_for_driver.py python | choose (nvidia-smi's output on stdin)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
