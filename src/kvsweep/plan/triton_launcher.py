"""What a compiled CUDA cell needs from its node besides a GPU: the tools Triton builds its launcher with.

Inductor turns a compiled graph into Triton kernels, and the first time Triton runs one it compiles a
small C module that launches it: with the compiler `$CC` names, else `gcc`, else `clang`, against the
Python headers in the folder sysconfig gives for the running interpreter. A pip-installed torch brings
neither, so on a bare node every compiled CUDA cell would end in a compiler error at its first call.
The planner looks where Triton looks and plans those cells as skipped, saying what to install.
(A compiled CPU cell compiles C++ with Inductor's own compiler search, and is not judged here.)
"""

import os
import shutil
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LauncherToolchain:
    c_compiler: str | None  # the compiler Triton would run; None: it would find none
    named_compiler: str | None  # what $CC asks for, when set
    python_include: str  # the folder Triton passes to the compiler for Python.h
    python_headers: bool  # Python.h is in it

    def missing(self) -> list[str]:
        python = f"python{sys.version_info.major}.{sys.version_info.minor}"
        named = self.named_compiler
        compiler = "a C compiler (gcc)" if named is None else f"the compiler $CC names ({named})"
        return [
            what
            for what, present in (
                (compiler, self.c_compiler is not None),
                (f"Python's headers (no Python.h in {self.python_include}; e.g. {python}-dev)", self.python_headers),
            )
            if not present
        ]


def python_include_dir() -> str:
    """Where Triton looks for Python.h: the default install scheme's include folder (Debian's
    `posix_local` read as `posix_prefix`, as Triton does)."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def find_launcher_toolchain(
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] = shutil.which,
    python_include: str | None = None,
) -> LauncherToolchain:
    """`$CC` when set (and only it), else `gcc`, else `clang`: Triton's search order."""
    named = env.get("CC")
    compiler = which(named) if named is not None else (which("gcc") or which("clang"))
    include = python_include or python_include_dir()
    return LauncherToolchain(compiler, named, include, (Path(include) / "Python.h").is_file())


def launcher_problem(toolchain: LauncherToolchain | None = None) -> str | None:
    """Why a compiled CUDA cell cannot run here, or None. `toolchain`: this machine's when None."""
    missing = (toolchain or find_launcher_toolchain()).missing()
    if not missing:
        return None
    return (
        f"compiled CUDA cells run Triton kernels, whose launcher Triton compiles with a C compiler on first use, "
        f"and this machine lacks {' and '.join(missing)}; install them and rerun"
    )
