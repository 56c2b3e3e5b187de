"""What a compiled CUDA cell needs from its node besides a GPU: what Triton builds its launcher with.

The first time a process uses Triton on CUDA, Triton compiles a small C module (its driver, which launches every
kernel) against Python.h and links it to libcuda; where it looks for each is in docs/measurement.md. Details that
matter here: `$CC`, when set, is the only compiler tried; Python.h is sought in sysconfig's include folder for the
interpreter's default scheme (Debian's `posix_local` read as `posix_prefix`); `$TRITON_LIBCUDA_PATH` is trusted as
it is. A pip-installed torch brings none of these, and a container may hold `libcuda.so.1` alone, so every compiled
CUDA cell there would end in a compiler or linker error at its first call.

The driver may be a CPU head node or a laptop, so a sweep asks each GPU node (`driver/native_builds.py`) and each
cell asks again on its own node; the plan made on the driver does not judge it. (A compiled CPU cell uses
Inductor's own C++ compiler search, not judged here.)
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvsweep.package_source import assigned_value, package_file

LAUNCHER_REASON_PREFIX = "compiled CUDA cells run Triton kernels"  # every reason `launcher_problem` gives starts so
LDCONFIG = "/sbin/ldconfig"  # the path Triton runs, not a PATH search
LIBCUDA_SONAME = "libcuda.so.1"  # the file Triton looks for in each folder
_SHARED_LIBRARY_FILE = re.compile(r"\.so(\.\d+)*$|\.a$")  # Triton links such a name as `-l:NAME`


@dataclass(frozen=True)
class LauncherToolchain:
    c_compiler: str | None  # the compiler Triton would run; None: it would find none
    named_compiler: str | None  # what $CC asks for, when set
    python_include: str  # the folder Triton passes to the compiler for Python.h
    python_headers: bool  # Python.h is in it
    libcuda: str | None = None  # what keeps the link from finding libcuda; None: it finds it

    def missing(self) -> list[str]:
        python = f"python{sys.version_info.major}.{sys.version_info.minor}"
        named = self.named_compiler
        compiler = "a C compiler (gcc or clang on PATH)" if named is None else f"the compiler $CC names ({named!r})"
        headers = f"Python's headers (no Python.h in {self.python_include}; e.g. {python}-dev)"
        return [
            what
            for what, present in (
                (compiler, self.c_compiler is not None),
                (headers, self.python_headers),
                (self.libcuda or "", self.libcuda is None),
            )
            if not present
        ]


def python_include_dir() -> str:
    """Where Triton looks for Python.h: the default install scheme's include folder."""
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def read_ldconfig() -> str | None:
    """`/sbin/ldconfig -p`, the linker cache Triton reads; None where it cannot be run."""
    try:
        done = subprocess.run([LDCONFIG, "-p"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="ignore")


def triton_libcuda_name(driver_py: Path | None = None) -> str:
    """The libcuda name the installed Triton links (its NVIDIA driver module's `libraries`), read
    without importing Triton; `libcuda.so.1`, what current releases link, when it cannot be read.

    `driver_py`: that module's file (the installed Triton's when None).
    """
    path = driver_py or package_file("triton", "backends", "nvidia", "driver.py")
    libraries = assigned_value(path, "libraries")
    names = libraries if isinstance(libraries, list | tuple) else []
    return next((name for name in names if isinstance(name, str) and "cuda" in name), LIBCUDA_SONAME)


def linked_file(library: str) -> str:
    """The file the linker needs for a name in Triton's `libraries` (`cuda` is `-lcuda`: libcuda.so)."""
    return library if _SHARED_LIBRARY_FILE.search(library) else f"lib{library}.so"


def libcuda_problem(env: Mapping[str, str], ldconfig: Callable[[], str | None], library: str) -> str | None:
    """What keeps Triton's link from libcuda, in the words of what to provide; None: nothing.

    `ldconfig`: the linker cache listing (`read_ldconfig`); `library`: the name Triton links.
    """
    if env.get("TRITON_LIBCUDA_PATH"):
        return None  # Triton takes it as it is, and so does this check
    listing = ldconfig()
    if listing is None:
        return f"{LDCONFIG} (Triton finds libcuda with it; or set TRITON_LIBCUDA_PATH to {LIBCUDA_SONAME}'s folder)"
    folders = [str(Path(line.split()[-1]).parent) for line in listing.splitlines() if LIBCUDA_SONAME in line]
    if not folders:
        on_path = [folder for folder in env.get("LD_LIBRARY_PATH", "").split(":") if folder]
        folders = [folder for folder in on_path if Path(folder, LIBCUDA_SONAME).exists()]
    present = [folder for folder in folders if Path(folder, LIBCUDA_SONAME).exists()]
    if not present:
        return (
            f"{LIBCUDA_SONAME} where Triton looks ({LDCONFIG} -p, then LD_LIBRARY_PATH; "
            "run ldconfig after installing the driver, or set TRITON_LIBCUDA_PATH to its folder)"
        )
    needed = linked_file(library)
    if needed == LIBCUDA_SONAME or any(Path(folder, needed).exists() for folder in present):
        return None
    return (
        f"{needed} beside {LIBCUDA_SONAME} in {', '.join(present)} (this Triton links -l{library}; "
        f"a {needed} symlink to {LIBCUDA_SONAME} there will do)"
    )


def find_launcher_toolchain(
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] = shutil.which,
    python_include: str | None = None,
    ldconfig: Callable[[], str | None] = read_ldconfig,
    library: str | None = None,
) -> LauncherToolchain:
    """This machine's, searched in Triton's order. `library`: the libcuda name Triton links (the
    installed Triton's when None)."""
    named = env.get("CC")
    compiler = which(named) if named is not None else (which("gcc") or which("clang"))
    include = python_include or python_include_dir()
    libcuda = libcuda_problem(env, ldconfig, library or triton_libcuda_name())
    return LauncherToolchain(compiler, named, include, (Path(include) / "Python.h").is_file(), libcuda)


def launcher_problem(toolchain: LauncherToolchain | None = None, where: str = "this machine") -> str | None:
    """Why a compiled CUDA cell cannot run where `toolchain` was found (this machine's when None), or None.

    `where`: the machine as the reason names it (a node's address when the driver asks a node).
    """
    missing = (toolchain or find_launcher_toolchain()).missing()
    if not missing:
        return None
    return (
        f"{LAUNCHER_REASON_PREFIX}, whose launcher Triton compiles and links against libcuda on first use, "
        f"and {where} lacks {' and '.join(missing)}; provide them and rerun"
    )
