"""quanto's native extensions: planned as skipped where they can neither be found built nor be built (issue 15).

The planner reads the machine the way `torch.utils.cpp_extension` does (CUDA_HOME, nvcc on PATH,
ninja, a C++ compiler); the tests build those machines from environment variables and files.
"""

import functools
import importlib.metadata
import importlib.util
import os
import shutil
import traceback
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kvsweep.caches import CacheStrategy, get_strategy, registered
from kvsweep.caches.native_build import (
    NativeBuild,
    Toolchain,
    build_problem,
    find_toolchain,
    installed_torch_version,
)
from kvsweep.grid import Cell
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.sweep_plan import model_facts

SHAPE = model_facts(["tiny-llama"], False)[0]["tiny-llama"].shape
QUANTO_CELL = Cell("tiny-llama", "float16", 256, 1, 32, "quantized-quanto-int4", False)
HQQ_CELL = Cell("tiny-llama", "float16", 256, 1, 32, "quantized-hqq-int4", False)


def _executables(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = folder / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return folder


def _package_with_stamp(root: Path, stamp: str | None, name: str = "fake_cuda") -> NativeBuild:
    """An importable package `fakeext_NAME` whose extension was built for torch `stamp` (None: never built)."""
    package = f"fakeext_{name}"
    build_dir = root / package / "kernels" / "build"
    build_dir.mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    if stamp is not None:
        (build_dir / "pytorch_version.txt").write_text(stamp + "\n")
    return NativeBuild(name, "cuda", package, "kernels/build", "pytorch_version.txt", build=lambda: None)


@pytest.fixture
def unbuilt_quanto(tmp_path, monkeypatch) -> Iterator[CacheStrategy]:
    """quanto's int4 strategy, registered with both its extensions installed but never built, whatever an
    earlier test compiled into site-packages: the skip path is tested on every machine."""
    monkeypatch.syspath_prepend(str(tmp_path))
    quanto = get_strategy("quantized-quanto-int4")
    unbuilt = tuple(
        replace(_package_with_stamp(tmp_path, None, b.name), device=b.device) for b in quanto.requires.native_builds
    )
    strategy = replace(quanto, name="quanto-unbuilt", requires=replace(quanto.requires, native_builds=unbuilt))
    with registered(strategy):
        yield strategy


def _installed(module: str) -> bool:
    return True  # the package is there; only its extension may not be built


def _plan(cell: Cell, device: str, toolchain: Toolchain | None = None):
    return plan_cell(cell, device, SHAPE, _installed, toolchain=toolchain)


def test_quanto_needs_its_cpu_extension_on_cpu_and_its_cuda_one_on_cuda():
    """quanto's own names and folders: `quanto_cpp` (library/extensions/cpp), `quanto_cuda` (.../cuda)."""
    builds = get_strategy("quantized-quanto-int4").requires.native_builds
    assert {(b.name, b.device, b.build_dir) for b in builds} == {
        ("quanto_cpp", "cpu", "library/extensions/cpp/build"),
        ("quanto_cuda", "cuda", "library/extensions/cuda/build"),
    }
    assert get_strategy("quantized-hqq-int4").requires.native_builds == ()  # hqq builds nothing


def test_an_unbuilt_extension_is_planned_as_skipped_saying_what_to_install(unbuilt_quanto):
    on_cuda = replace(QUANTO_CELL, cache=unbuilt_quanto.name)
    on_cpu = replace(on_cuda, dtype="float32")
    no_nvcc = Toolchain(cuda_home=None, ninja=True, compiler=True)
    nothing = Toolchain(cuda_home=None, ninja=False, compiler=False)
    skipped = _plan(on_cuda, "cuda", no_nvcc)
    assert not skipped.runs
    assert "quanto_cuda" in skipped.skip_reason and "CUDA_HOME" in skipped.skip_reason
    assert _plan(on_cuda, "cuda", Toolchain("/opt/cuda", ninja=True, compiler=True)).runs
    assert _plan(on_cpu, "cpu", no_nvcc).runs  # quanto_cpp needs no CUDA toolkit
    bare = _plan(on_cpu, "cpu", nothing)
    assert not bare.runs and "quanto_cpp" in bare.skip_reason and "c++" in bare.skip_reason
    assert _plan(HQQ_CELL, "cuda", nothing).runs  # hqq builds nothing: unaffected


def test_the_planner_reads_the_toolkit_from_this_machines_environment(unbuilt_quanto, tmp_path, monkeypatch):
    cell = replace(QUANTO_CELL, cache=unbuilt_quanto.name)
    cuda = tmp_path / "cuda"
    _executables(cuda / "bin", "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(_executables(tmp_path / "bin", "ninja", "c++")))
    assert _plan(cell, "cuda").runs
    monkeypatch.setenv("PATH", str(_executables(tmp_path / "empty")))  # no c++ here
    skipped = _plan(cell, "cuda")
    assert not skipped.runs and "c++" in skipped.skip_reason


def test_the_toolkit_is_found_where_torch_looks_for_it(tmp_path):
    nvcc = _executables(tmp_path / "cuda-12.8" / "bin", "nvcc") / "nvcc"
    on_path = {"nvcc": str(nvcc), "ninja": "/usr/bin/ninja", "c++": "/usr/bin/c++"}
    found = find_toolchain(env={}, which=on_path.get, is_dir=lambda p: False)
    assert found == Toolchain(str(tmp_path / "cuda-12.8"), ninja=True, compiler=True)
    explicit = find_toolchain(env={"CUDA_HOME": "/opt/cuda"}, which=on_path.get, is_dir=lambda p: False)
    assert explicit.cuda_home == "/opt/cuda"  # CUDA_HOME wins over nvcc on PATH, as in torch
    bare = find_toolchain(env={}, which=lambda name: None, is_dir=lambda p: False)
    ninja_module = importlib.util.find_spec("ninja") is not None  # pip's ninja counts, as in torch
    assert bare == Toolchain(cuda_home=None, ninja=ninja_module, compiler=False)
    assert len(bare.missing("cuda")) == (3 if not ninja_module else 2)
    assert len(bare.missing("cpu")) == (2 if not ninja_module else 1)  # a CPU extension needs no CUDA toolkit


@pytest.mark.parametrize(
    ("stamp", "needs_toolkit"),
    [(torch.__version__, False), ("1.0.0", True), (None, True)],  # quanto stamps torch.__version__
)
def test_an_extension_built_for_the_installed_torch_needs_no_toolkit(tmp_path, monkeypatch, stamp, needs_toolkit):
    monkeypatch.syspath_prepend(str(tmp_path))
    build = _package_with_stamp(tmp_path, stamp)
    nothing = Toolchain(cuda_home=None, ninja=False, compiler=False)
    problem = build_problem(build, nothing)
    assert (problem is not None) == needs_toolkit  # an old torch's build is rebuilt by the package
    if problem:
        assert "fake_cuda" in problem and "nvcc" in problem and os.sep not in problem.split("(")[0]


def test_a_one_node_cluster_rebuilds_nothing_already_built(tmp_path, monkeypatch):
    from kvsweep.caches import Requirements
    from kvsweep.driver.native_builds import needed_builds
    from kvsweep.plan.cell_plan import PlannedCell

    monkeypatch.syspath_prepend(str(tmp_path))
    built = replace(_package_with_stamp(tmp_path, importlib.metadata.version("torch")), device="cpu")
    needs = Requirements(native_builds=(built,))
    strategy = replace(get_strategy("dynamic"), name="dynamic-with-a-build", requires=needs)
    with registered(strategy):
        planned = [PlannedCell(Cell("tiny-llama", "float32", 64, 1, 4, strategy.name, False), None)]
        assert needed_builds(planned, "cpu", nodes=[{}]) == []  # built here for this torch: left alone
        assert needed_builds(planned, "cpu", nodes=[{}, {}]) == [built]  # other nodes may lack it
        assert needed_builds(planned, "cuda", nodes=[{}, {}]) == []  # a CPU extension is no CUDA cell's business
        skipped = [PlannedCell(planned[0].cell, "skipped for another reason")]
        assert needed_builds(skipped, "cpu", nodes=[{}, {}]) == []


def _pypi_cuda_torch(site: Path) -> Path:
    """torch as PyPI's CUDA wheel installs it: `__version__` 2.13.0+cu126 in version.py, 2.13.0 in its metadata."""
    folder = site / "torch"
    folder.mkdir(parents=True)
    (folder / "version.py").write_text("from typing import Optional\n\n__version__ = '2.13.0+cu126'\ndebug = False\n")
    metadata = site / "torch-2.13.0.dist-info" / "METADATA"
    metadata.parent.mkdir()
    metadata.write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    return folder


def test_a_stamp_of_a_cuda_wheel_counts_as_built(tmp_path, monkeypatch):
    """quanto stamps torch.__version__; PyPI's metadata lacks the local tag, so the stamp never matched it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    build = _package_with_stamp(tmp_path, "2.13.0+cu126")
    torch_folder = _pypi_cuda_torch(tmp_path / "site")
    (wheel,) = importlib.metadata.distributions(path=[str(tmp_path / "site")])
    assert wheel.version == "2.13.0"  # what the old check compared with
    version = installed_torch_version(torch_folder)
    assert version == "2.13.0+cu126"
    assert build.built_for_installed_torch(version)
    assert not build.built_for_installed_torch("2.13.0")  # the metadata's version never matched this stamp


def test_a_build_for_another_variant_of_the_same_torch_is_not_built(tmp_path, monkeypatch):
    """quanto compares its stamp with torch.__version__ exactly and rebuilds a `+cpu` build for `+cu126`."""
    monkeypatch.syspath_prepend(str(tmp_path))
    build = _package_with_stamp(tmp_path, "2.13.0+cpu")
    assert not build.built_for_installed_torch("2.13.0+cu126")


def test_the_installed_torch_version_is_read_without_importing_torch(tmp_path):
    assert installed_torch_version() == torch.__version__  # this machine's torch, read from its files
    assert installed_torch_version(tmp_path) is None  # no version.py: unknown, so never "built"
    (tmp_path / "version.py").write_text("__version__ = get_version()\n")
    assert installed_torch_version(tmp_path) is None


def _ray_task_error(cause: Exception) -> Exception:
    """What `ray.get` raises for an exception inside `_build_on_this_node`: Ray's own wrapper of it."""
    from ray.exceptions import RayTaskError

    try:
        raise cause
    except Exception as raised:
        trace = traceback.format_exc()
        error = RayTaskError("_build_on_this_node", trace, raised, "ray::_build_on_this_node", 4242, "10.0.0.7")
    return error.as_instanceof_cause()


# torch's build error (torch/utils/cpp_extension.py `_run_ninja_build`): the prefix, then ninja's log
NINJA_LOG = (
    "Error building extension 'quanto_cuda': [1/3] /usr/local/cuda/bin/nvcc -c unpack.cu -o unpack.cuda.o\n"
    "FAILED: unpack.cuda.o\n"
    "/usr/local/cuda/bin/nvcc -c unpack.cu -o unpack.cuda.o\n"
    "unpack.cu:1:10: fatal error: cuda_fp16.h: No such file or directory\n"
    "    1 | #include <cuda_fp16.h>\n"
    "compilation terminated.\n"
    "ninja: build stopped: subcommand failed.\n"
)


def test_a_failed_build_is_told_by_the_compilers_error_not_rays_header():
    from kvsweep.driver.native_builds import build_failure
    from kvsweep.errors import first_line

    error = _ray_task_error(RuntimeError(NINJA_LOG))
    assert "ray::_build_on_this_node" in first_line(error)  # what a cell's skip reason used to say
    assert build_failure(error) == "unpack.cu:1:10: fatal error: cuda_fp16.h: No such file or directory"
    ninja_missing = _ray_task_error(RuntimeError("Ninja is required to load C++ extensions (pip install ninja)"))
    assert build_failure(ninja_missing) == "Ninja is required to load C++ extensions (pip install ninja)"
    assert build_failure(TimeoutError()) == "TimeoutError"  # nothing to say but what happened


def test_rays_text_alone_still_gives_the_cause():
    """A cause Ray cannot pickle reaches the driver as text only: header, traceback, the message."""
    from ray.exceptions import RayError

    from kvsweep.driver.native_builds import build_failure

    text = str(_ray_task_error(RuntimeError("Error building extension 'quanto_cpp'\nerror: command 'c++' failed")))
    assert text.startswith("\x1b[")  # Ray colours its header line
    assert build_failure(RayError(text)) == "error: command 'c++' failed"
    headline = str(_ray_task_error(OSError("CUDA_HOME environment variable is not set.")))
    assert build_failure(RayError(headline)) == "OSError: CUDA_HOME environment variable is not set."


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_a_real_build_failing_in_a_ray_task_skips_its_cells_with_the_compilers_line(ray_cluster, tmp_path):
    """A real torch build of a source with a missing header, in a real Ray task on this node."""
    from torch.utils.cpp_extension import load

    from kvsweep.caches import Requirements
    from kvsweep.driver.native_builds import prebuild
    from kvsweep.plan.cell_plan import PlannedCell

    source = tmp_path / "broken.cpp"
    source.write_text("#include <kvsweep_no_such_header.h>\n")
    (tmp_path / "build").mkdir()
    compile_it = functools.partial(load, "kvsweep_broken", [str(source)], build_directory=str(tmp_path / "build"))
    broken = NativeBuild("kvsweep_broken", "cpu", "kvsweep_not_installed", "build", "stamp.txt", compile_it)
    needs = Requirements(native_builds=(broken,))
    strategy = replace(get_strategy("dynamic"), name="dynamic-broken-build", requires=needs)
    said: list[str] = []
    with registered(strategy):
        cell = Cell("tiny-llama", "float32", 64, 1, 4, strategy.name, False)
        planned = prebuild([PlannedCell(cell, None)], "cpu", said.append)
    reason = planned[0].skip_reason or ""
    assert "kvsweep_no_such_header.h" in reason and "error" in reason, reason
    assert reason.startswith("building kvsweep_broken failed: ")
    assert "ray::" not in reason and "pid=" not in reason and "\x1b" not in reason, reason
