"""Compiled CUDA cells are planned as skipped where Triton could not build its kernel launcher.

The machines are folders: a bin folder holding (or not) stand-in compilers, an include folder holding
(or not) Python.h; the search itself is the one Triton runs ($CC, else gcc, else clang).
"""

import shutil
import subprocess
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from kvsweep.grid import Cell
from kvsweep.plan.cell_plan import plan_cell, skip_reason
from kvsweep.plan.sweep_plan import model_facts
from kvsweep.plan.triton_launcher import find_launcher_toolchain, launcher_problem, python_include_dir

SHAPE = model_facts(["tiny-llama"], False)[0]["tiny-llama"].shape
COMPILED = Cell("tiny-llama", "float16", 256, 1, 32, "static", True)


def _folder_which(folder: Path):
    """`shutil.which` over one folder of executables."""
    return lambda name: shutil.which(name, path=str(folder))


def _executables(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\nexit 0\n")
        (folder / name).chmod(0o755)
    return folder


def _headers(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Python.h").write_text("/* stand-in */\n")
    return str(folder)


def test_triton_takes_cc_else_gcc_else_clang(tmp_path):
    include = _headers(tmp_path / "include")
    both = _folder_which(_executables(tmp_path / "both", "gcc", "clang"))
    only_clang = _folder_which(_executables(tmp_path / "clang", "clang"))
    assert find_launcher_toolchain({}, both, include).c_compiler == str(tmp_path / "both" / "gcc")
    assert find_launcher_toolchain({}, only_clang, include).c_compiler == str(tmp_path / "clang" / "clang")
    chosen = find_launcher_toolchain({"CC": "clang"}, both, include)
    assert chosen.c_compiler == str(tmp_path / "both" / "clang")
    # $CC is the only compiler Triton tries when it is set: gcc on PATH does not rescue a wrong one
    wrong = find_launcher_toolchain({"CC": "gcc-99"}, both, include)
    assert wrong.c_compiler is None and launcher_problem(wrong) is not None
    assert "$CC names (gcc-99)" in launcher_problem(wrong)
    assert launcher_problem(find_launcher_toolchain({}, only_clang, include)) is None


def test_a_missing_compiler_or_missing_headers_is_named_in_one_line(tmp_path):
    empty = _folder_which(_executables(tmp_path / "empty"))
    gcc = _folder_which(_executables(tmp_path / "bin", "gcc"))
    no_headers = str(tmp_path / "include")
    (tmp_path / "include").mkdir()
    nothing = launcher_problem(find_launcher_toolchain({}, empty, no_headers))
    assert nothing is not None and "\n" not in nothing
    assert "a C compiler (gcc)" in nothing and f"Python.h in {no_headers}" in nothing
    headers_only = launcher_problem(find_launcher_toolchain({}, gcc, no_headers))
    assert headers_only is not None and "Python.h" in headers_only and "C compiler (gcc)" not in headers_only


def test_compiled_cuda_cells_are_skipped_on_a_node_without_a_c_compiler(tmp_path, monkeypatch):
    """The planner reads this machine's $CC and PATH, as Triton will inside the cell."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(_executables(tmp_path / "empty")))
    skipped = plan_cell(COMPILED, "cuda", SHAPE)
    assert not skipped.runs and "a C compiler (gcc)" in skipped.skip_reason
    assert plan_cell(replace(COMPILED, compile=False), "cuda", SHAPE).runs  # eager cells launch no Triton kernel
    assert plan_cell(replace(COMPILED, dtype="float32"), "cpu", SHAPE).runs  # CPU compile is not Triton's
    monkeypatch.setenv("PATH", str(_executables(tmp_path / "bin", "gcc")))
    assert plan_cell(COMPILED, "cuda", SHAPE).runs == Path(python_include_dir(), "Python.h").is_file()


def test_missing_headers_skip_compiled_cuda_cells(tmp_path):
    (tmp_path / "include").mkdir()
    bare = find_launcher_toolchain({}, _folder_which(_executables(tmp_path / "bin", "gcc")), str(tmp_path / "include"))
    reason = skip_reason(COMPILED, "cuda", SHAPE, lambda module: True, launcher=bare)
    assert reason is not None and "Python.h" in reason
    assert skip_reason(replace(COMPILED, compile=False), "cuda", SHAPE, lambda module: True, launcher=bare) is None


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_include_folder_is_the_one_a_c_compiler_finds_python_h_in(tmp_path):
    """A second reading: the interpreter's own INCLUDEPY, and gcc compiling `#include <Python.h>` with it."""
    include = python_include_dir()
    if not Path(include, "Python.h").is_file():
        pytest.skip("this interpreter has no headers installed")
    assert Path(include).resolve() == Path(sysconfig.get_config_var("INCLUDEPY")).resolve()
    source = tmp_path / "launcher.c"
    source.write_text("#include <Python.h>\nint main(void) { return Py_IsInitialized(); }\n")
    done = subprocess.run(["gcc", "-fsyntax-only", f"-I{include}", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
