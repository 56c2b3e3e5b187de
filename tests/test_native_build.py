"""quanto's CUDA extension: planned as skipped where it can neither be found built nor be built (issue 15).

The planner reads the machine the way `torch.utils.cpp_extension` does (CUDA_HOME, nvcc on PATH,
ninja, a C++ compiler); the tests build those machines from environment variables and files.
"""

import importlib.metadata
import os
from pathlib import Path

import pytest

from kvsweep.caches.native_build import QUANTO_CPP, QUANTO_CUDA, NativeBuild, Toolchain, build_problem, find_toolchain
from kvsweep.grid import Cell
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.sweep_plan import model_facts

QUANTO_CELL = Cell("tiny-llama", "float16", 256, 1, 32, "quantized-quanto-int4", False)
HQQ_CELL = Cell("tiny-llama", "float16", 256, 1, 32, "quantized-hqq-int4", False)


def _executables(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = folder / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return folder


def _plan(cell: Cell, toolchain: Toolchain | None = None):
    facts, _ = model_facts([cell.model], False)
    return plan_cell(cell, "cuda", facts[cell.model].shape, toolchain=toolchain)


def test_quanto_on_cuda_is_skipped_without_a_cuda_toolkit_saying_what_to_install():
    pytest.importorskip("optimum.quanto")
    no_nvcc = Toolchain(cuda_home=None, ninja=True, compiler=True)
    planned = _plan(QUANTO_CELL, no_nvcc)
    if QUANTO_CUDA.built_for_installed_torch():
        assert planned.runs  # built before for this torch: nothing to compile
        return
    assert not planned.runs
    assert "quanto_cuda" in planned.skip_reason and "CUDA_HOME" in planned.skip_reason
    assert _plan(HQQ_CELL, no_nvcc).runs  # hqq builds nothing: unaffected
    assert _plan(QUANTO_CELL, Toolchain("/opt/cuda", ninja=True, compiler=True)).runs


def test_the_planner_reads_the_toolkit_from_this_machines_environment(tmp_path, monkeypatch):
    pytest.importorskip("optimum.quanto")
    cuda = tmp_path / "cuda"
    _executables(cuda / "bin", "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.setenv("PATH", str(_executables(tmp_path / "bin", "ninja", "c++")))
    assert _plan(QUANTO_CELL).runs


def test_the_toolkit_is_found_where_torch_looks_for_it(tmp_path):
    nvcc = _executables(tmp_path / "cuda-12.8" / "bin", "nvcc") / "nvcc"
    on_path = {"nvcc": str(nvcc), "ninja": "/usr/bin/ninja", "c++": "/usr/bin/c++"}
    found = find_toolchain(env={}, which=on_path.get, is_dir=lambda p: False)
    assert found == Toolchain(str(tmp_path / "cuda-12.8"), ninja=True, compiler=True)
    explicit = find_toolchain(env={"CUDA_HOME": "/opt/cuda"}, which=on_path.get, is_dir=lambda p: False)
    assert explicit.cuda_home == "/opt/cuda"  # CUDA_HOME wins over nvcc on PATH, as in torch
    bare = find_toolchain(env={}, which=lambda name: None, is_dir=lambda p: False)
    assert len(bare.missing()) == 3 if importlib.util.find_spec("ninja") is None else 2


def _package_with_stamp(root: Path, stamp: str | None) -> NativeBuild:
    build_dir = root / "fakeext" / "kernels" / "build"
    build_dir.mkdir(parents=True)
    (root / "fakeext" / "__init__.py").write_text("")
    if stamp is not None:
        (build_dir / "pytorch_version.txt").write_text(stamp + "\n")
    return NativeBuild("fake_cuda", "cuda", "fakeext", "kernels/build", "pytorch_version.txt", build=lambda: None)


@pytest.mark.parametrize(
    ("stamp", "needs_toolkit"),
    [(importlib.metadata.version("torch"), False), ("1.0.0", True), (None, True)],
)
def test_an_extension_built_for_the_installed_torch_needs_no_toolkit(tmp_path, monkeypatch, stamp, needs_toolkit):
    monkeypatch.syspath_prepend(str(tmp_path))
    build = _package_with_stamp(tmp_path, stamp)
    nothing = Toolchain(cuda_home=None, ninja=False, compiler=False)
    problem = build_problem(build, nothing)
    assert (problem is not None) == needs_toolkit  # an old torch's build is rebuilt by the package
    if problem:
        assert "fake_cuda" in problem and "nvcc" in problem and os.sep not in problem.split("(")[0]


def test_quanto_on_cpu_needs_only_a_compiler_and_ninja_and_is_skipped_without_them():
    pytest.importorskip("optimum.quanto")
    cpu_cell = Cell("tiny-llama", "float32", 256, 1, 32, "quantized-quanto-int4", False)
    facts, _ = model_facts([cpu_cell.model], False)
    shape = facts[cpu_cell.model].shape
    no_cuda = Toolchain(cuda_home=None, ninja=True, compiler=True)
    assert plan_cell(cpu_cell, "cpu", shape, toolchain=no_cuda).runs  # no CUDA toolkit needed for quanto_cpp
    nothing = Toolchain(cuda_home=None, ninja=False, compiler=False)
    planned = plan_cell(cpu_cell, "cpu", shape, toolchain=nothing)
    if QUANTO_CPP.built_for_installed_torch():
        assert planned.runs  # built before for this torch: nothing to compile
    else:
        assert not planned.runs and "quanto_cpp" in planned.skip_reason and "c++" in planned.skip_reason


def test_a_one_node_cluster_rebuilds_nothing_already_built(tmp_path, monkeypatch):
    from dataclasses import replace

    from kvsweep.caches import Requirements, get_strategy, registered
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
