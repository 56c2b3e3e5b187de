"""Native extensions a cache backend compiles on first use, and whether this machine can build them.

optimum-quanto compiles its CUDA kernels (`quanto_cuda`: unpack, AWQ, Marlin) with
`torch.utils.cpp_extension.load` the first time a CUDA cell needs them: minutes of nvcc inside a
cell's first call, written into site-packages, and an `error` for every cell where no CUDA toolkit
is installed (a pip-installed torch brings none). kvsweep plans such cells as skipped when the
build cannot happen, and otherwise builds once per node before any cell is timed.
"""

import importlib
import importlib.metadata
import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NativeBuild:
    name: str  # the extension's name, as the package registers it
    package: str  # importable module that owns it
    build_dir: str  # relative to the package's folder; holds the built library and a version stamp
    version_stamp: str  # file in build_dir naming the torch version it was built for
    build: Callable[[], None]  # compiles it (or loads it when already built); needs a visible GPU

    def built_for_installed_torch(self) -> bool:
        """Built before, for the torch installed now (the package rebuilds on a version change)."""
        spec = importlib.util.find_spec(self.package.split(".")[0])
        locations = list(spec.submodule_search_locations or []) if spec else []
        relative = Path(*self.package.split(".")[1:], self.build_dir)
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return False
        for root in locations:
            stamp = Path(root) / relative / self.version_stamp
            if stamp.is_file() and stamp.read_text().strip() == torch_version:
                return True
        return False


@dataclass(frozen=True)
class Toolchain:
    """What `torch.utils.cpp_extension` needs to build a CUDA extension (it looks in the same places)."""

    cuda_home: str | None
    ninja: bool
    compiler: bool

    def missing(self) -> list[str]:
        return [
            what
            for what, present in (
                ("a CUDA toolkit (nvcc; set CUDA_HOME)", self.cuda_home is not None),
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
    missing = (toolchain or find_toolchain()).missing()
    if not missing:
        return None
    return (
        f"{build.package} compiles its CUDA extension {build.name} on first use and this machine lacks "
        f"{', '.join(missing)}; install them (the CUDA toolkit matching torch's CUDA version) and rerun"
    )


def _build_quanto_cuda() -> None:
    importlib.import_module("optimum.quanto")
    extensions = importlib.import_module("optimum.quanto.library.extensions")
    extensions.get_extension("quanto_cuda").lib  # noqa: B018  (the property compiles or loads it)


QUANTO_CUDA = NativeBuild(
    name="quanto_cuda",
    package="optimum.quanto",
    build_dir="library/extensions/cuda/build",
    version_stamp="pytorch_version.txt",
    build=_build_quanto_cuda,
)
