"""Native extensions a cache backend compiles on first use, and whether this machine can build them.

optimum-quanto compiles its kernels with `torch.utils.cpp_extension.load` the first time a cell needs them (CUDA
`quanto_cuda`: minutes of nvcc; CPU `quanto_cpp`: about a minute of g++ on 2 cores) inside a cell's first call,
into site-packages, and fails every cell where the compiler is missing (a pip torch brings no CUDA toolkit). So
kvsweep plans such cells as skipped when the build cannot happen, and otherwise builds once per node first.
"""

import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvsweep.package_source import assigned_value, package_file


@dataclass(frozen=True)
class NativeBuild:
    name: str  # the extension's name, as the package registers it
    device: str  # the cells that need it: "cpu" or "cuda"
    package: str  # importable module that owns it
    build_dir: str  # relative to the package's folder; holds the built library and a version stamp
    version_stamp: str  # file in build_dir naming the torch version it was built for
    build: Callable[[], None]  # compiles it (or loads it when already built); CUDA ones need a visible GPU

    def built_for_installed_torch(self, torch_version: str | None = None) -> bool:
        """Built before, for the torch installed now (the package rebuilds when its stamp differs).

        `torch_version`: the installed torch's `__version__` (read from its files when None).
        """
        torch_version = torch_version or installed_torch_version()
        if torch_version is None:
            return False
        spec = importlib.util.find_spec(self.package.split(".")[0])
        locations = list(spec.submodule_search_locations or []) if spec else []
        relative = Path(*self.package.split(".")[1:], self.build_dir)
        for root in locations:
            stamp = Path(root) / relative / self.version_stamp
            if stamp.is_file() and stamp.read_text().strip() == torch_version:
                return True
        return False


def installed_torch_version(torch_dir: Path | None = None) -> str | None:
    """`torch.__version__` (e.g. `2.13.0+cu126`), read from torch's `version.py` without importing torch: the
    string quanto stamps and compares on load. Not the package metadata (PyPI's CUDA wheels declare `2.13.0`, so a
    stamp would never match), nor without the local tag (quanto rebuilds a `+cpu` build for a `+cu126` torch).
    `torch_dir`: the torch package folder (the installed one when None); None when unreadable.
    """
    version = assigned_value(
        torch_dir / "version.py" if torch_dir else package_file("torch", "version.py"), "__version__"
    )
    return version if isinstance(version, str) else None


@dataclass(frozen=True)
class Toolchain:
    """What `torch.utils.cpp_extension` needs to build a CUDA extension (it looks in the same places)."""

    cuda_home: str | None
    ninja: bool
    compiler: bool

    def missing(self, device: str = "cuda") -> list[str]:
        return [
            what
            for what, present in (
                ("a CUDA toolkit (nvcc; set CUDA_HOME)", self.cuda_home is not None or device != "cuda"),
                ("ninja (pip install ninja)", self.ninja),
                ("a C++ compiler (c++)", self.compiler),
            )
            if not present
        ]


def find_toolchain(
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] = shutil.which,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> Toolchain:
    """CUDA_HOME or CUDA_PATH, else nvcc's folder, else /usr/local/cuda: torch's own search order."""
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if not cuda_home and (nvcc := which("nvcc")):
        cuda_home = str(Path(nvcc).resolve().parent.parent)
    if not cuda_home and is_dir("/usr/local/cuda"):
        cuda_home = "/usr/local/cuda"
    ninja = which("ninja") is not None or importlib.util.find_spec("ninja") is not None
    compiler = which(env.get("CXX", "c++")) is not None
    return Toolchain(cuda_home, ninja, compiler)


def build_problem(build: NativeBuild, toolchain: Toolchain | None = None) -> str | None:
    """Why the extension can neither be found built nor be built here, or None."""
    if build.built_for_installed_torch():
        return None
    missing = (toolchain or find_toolchain()).missing(build.device)
    if not missing:
        return None
    hint = " (the CUDA toolkit matching torch's CUDA version)" if build.device == "cuda" else ""
    return (
        f"{build.package} compiles its {build.device.upper()} extension {build.name} on first use and this "
        f"machine lacks {', '.join(missing)}; install them{hint} and rerun"
    )


def _build_quanto(name: str) -> Callable[[], None]:
    def build() -> None:
        importlib.import_module("optimum.quanto")
        extensions = importlib.import_module("optimum.quanto.library.extensions")
        extensions.get_extension(name).lib  # noqa: B018  (the property compiles or loads it)

    return build


def _quanto_extension(name: str, device: str, folder: str) -> NativeBuild:
    return NativeBuild(
        name=name,
        device=device,
        package="optimum.quanto",
        build_dir=f"library/extensions/{folder}/build",
        version_stamp="pytorch_version.txt",  # quanto's own: it rebuilds when the torch version differs
        build=_build_quanto(name),
    )


QUANTO_CUDA = _quanto_extension("quanto_cuda", "cuda", "cuda")
QUANTO_CPP = _quanto_extension("quanto_cpp", "cpu", "cpp")
