"""Compiled CUDA cells are skipped where Triton could not build its launcher: judged on the nodes.

The machines are folders: a bin folder holding (or not) stand-in compilers, an include folder holding
(or not) Python.h, library folders holding (or not) stand-in libcuda files, and a linker-cache listing
in `/sbin/ldconfig -p`'s format. The search itself is the one Triton 3.7 to 3.9 run ($CC, else gcc,
else clang; TRITON_LIBCUDA_PATH, else ldconfig's folders, else LD_LIBRARY_PATH's).
"""

import functools
import shutil
import subprocess
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest

from kvsweep.driver.native_builds import launcher_problems, skip_compiled
from kvsweep.grid import Cell
from kvsweep.plan.cell_plan import PlannedCell, plan_cell, skip_reason
from kvsweep.plan.sweep_plan import model_facts
from kvsweep.plan.triton_launcher import (
    LAUNCHER_REASON_PREFIX,
    LauncherToolchain,
    find_launcher_toolchain,
    launcher_problem,
    libcuda_problem,
    linked_file,
    python_include_dir,
    triton_libcuda_name,
)

SHAPE = model_facts(["tiny-llama"], False)[0]["tiny-llama"].shape
COMPILED = Cell("tiny-llama", "float16", 256, 1, 32, "static", True)
EAGER = replace(COMPILED, compile=False)
COMPLETE = LauncherToolchain("/usr/bin/gcc", None, "/usr/include/python3.12", True)
NO_COMPILER = LauncherToolchain(None, None, "/usr/include/python3.12", True)


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


def _libraries(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def _ldconfig(*paths: Path):
    """What `/sbin/ldconfig -p` prints for a cache holding `paths`."""
    lines = [f"{len(paths)} libs found in cache `/etc/ld.so.cache'"]
    lines += [f"\t{path.name} (libc6,x86-64) => {path}" for path in paths]
    return lambda: "\n".join(lines) + "\n"


def _nothing_cached():
    return "0 libs found in cache `/etc/ld.so.cache'\n"


def _find(env, which, include, library="libcuda.so.1", ldconfig=_nothing_cached):
    return find_launcher_toolchain({"TRITON_LIBCUDA_PATH": "/driver", **env}, which, include, ldconfig, library)


def test_triton_takes_cc_else_gcc_else_clang(tmp_path):
    include = _headers(tmp_path / "include")
    both = _folder_which(_executables(tmp_path / "both", "gcc", "clang"))
    only_clang = _folder_which(_executables(tmp_path / "clang", "clang"))
    assert _find({}, both, include).c_compiler == str(tmp_path / "both" / "gcc")  # gcc before clang
    assert _find({}, only_clang, include).c_compiler == str(tmp_path / "clang" / "clang")
    assert _find({"CC": "clang"}, both, include).c_compiler == str(tmp_path / "both" / "clang")
    # $CC is the only compiler Triton tries when it is set: gcc on PATH does not rescue a wrong one
    wrong = _find({"CC": "gcc-99"}, both, include)
    reason = launcher_problem(wrong)
    assert wrong.c_compiler is None and reason is not None and "$CC names ('gcc-99')" in reason
    assert launcher_problem(_find({}, only_clang, include)) is None


def test_a_missing_compiler_or_missing_headers_is_named_in_one_line(tmp_path):
    empty = _folder_which(_executables(tmp_path / "empty"))
    gcc = _folder_which(_executables(tmp_path / "bin", "gcc"))
    no_headers = str(tmp_path / "include")
    (tmp_path / "include").mkdir()
    nothing = launcher_problem(_find({}, empty, no_headers))
    assert nothing is not None and "\n" not in nothing and nothing.startswith(LAUNCHER_REASON_PREFIX)
    assert "a C compiler (gcc or clang on PATH)" in nothing and f"Python.h in {no_headers}" in nothing
    headers_only = launcher_problem(_find({}, gcc, no_headers))
    assert headers_only is not None and "Python.h" in headers_only and "C compiler" not in headers_only


def test_libcuda_so_1_alone_is_enough_for_the_triton_torch_pins_today(tmp_path):
    """Triton 3.7 to 3.9 link `-l:libcuda.so.1`: a container holding only that file links."""
    driver = _libraries(tmp_path / "driver", "libcuda.so.1")
    assert libcuda_problem({}, _ldconfig(driver / "libcuda.so.1"), "libcuda.so.1") is None


def test_an_older_triton_linking_lcuda_needs_the_unversioned_libcuda_so(tmp_path):
    driver = _libraries(tmp_path / "driver", "libcuda.so.1")
    listing = _ldconfig(driver / "libcuda.so.1")
    problem = libcuda_problem({}, listing, "cuda")  # `-lcuda` makes the linker look for libcuda.so
    assert problem is not None and f"libcuda.so beside libcuda.so.1 in {driver}" in problem and "-lcuda" in problem
    _libraries(driver, "libcuda.so")
    assert libcuda_problem({}, listing, "cuda") is None


def test_libcuda_is_searched_where_triton_searches(tmp_path):
    on_path = _libraries(tmp_path / "on_path", "libcuda.so.1")
    empty = _libraries(tmp_path / "empty")
    # nothing in the linker cache: LD_LIBRARY_PATH's folders holding libcuda.so.1 are taken
    assert libcuda_problem({"LD_LIBRARY_PATH": f"{empty}:{on_path}"}, _nothing_cached, "libcuda.so.1") is None
    missing = libcuda_problem({"LD_LIBRARY_PATH": str(empty)}, _nothing_cached, "libcuda.so.1")
    assert missing is not None and missing.startswith("libcuda.so.1 where Triton looks")
    # a cache naming a folder whose libcuda.so.1 is gone: Triton does not fall back to LD_LIBRARY_PATH
    stale = libcuda_problem({"LD_LIBRARY_PATH": str(on_path)}, _ldconfig(empty / "libcuda.so.1"), "libcuda.so.1")
    assert stale is not None and stale.startswith("libcuda.so.1 where Triton looks")


def test_without_ldconfig_only_triton_libcuda_path_finds_libcuda(tmp_path):
    def no_ldconfig():
        return None

    problem = libcuda_problem({"LD_LIBRARY_PATH": str(tmp_path)}, no_ldconfig, "libcuda.so.1")
    assert problem is not None and problem.startswith("/sbin/ldconfig") and "TRITON_LIBCUDA_PATH" in problem

    def must_not_run():
        raise AssertionError("Triton does not run ldconfig when TRITON_LIBCUDA_PATH is set")

    assert libcuda_problem({"TRITON_LIBCUDA_PATH": str(tmp_path)}, must_not_run, "cuda") is None
    toolchain = find_launcher_toolchain({"CC": "true"}, shutil.which, _headers(tmp_path / "inc"), no_ldconfig, "x")
    reason = launcher_problem(toolchain, where="node 10.0.0.5")
    assert reason is not None and reason.startswith(LAUNCHER_REASON_PREFIX)
    assert "node 10.0.0.5 lacks /sbin/ldconfig" in reason


def test_the_linked_name_is_read_from_the_installed_triton(tmp_path):
    current, older = tmp_path / "current.py", tmp_path / "older.py"
    current.write_text("import os\nlibraries = ['libcuda.so.1']\nPyKernelArg = None\n")
    older.write_text("import os\nlibrary_dir = ['lib']\nlibraries = ['cuda']\n")
    assert triton_libcuda_name(current) == "libcuda.so.1"
    assert triton_libcuda_name(older) == "cuda"
    assert triton_libcuda_name(tmp_path / "no_such_driver.py") == "libcuda.so.1"  # unreadable: today's name
    # the linker's rules: `-lNAME` looks for libNAME.so; Triton passes a file name as `-l:FILE`
    assert (linked_file("cuda"), linked_file("libcuda.so.1")) == ("libcuda.so", "libcuda.so.1")
    assert linked_file("libcuda.so.550.54.15") == "libcuda.so.550.54.15"


def test_the_driver_does_not_judge_the_nodes_toolchain_but_a_cell_judges_its_own(tmp_path, monkeypatch):
    """The plan is made on the driver (a CPU head, a laptop); `_load` runs `skip_reason` on the cell's node."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(_executables(tmp_path / "empty")))  # this machine: no compiler at all
    assert plan_cell(COMPILED, "cuda", SHAPE).runs
    in_cell = skip_reason(COMPILED, "cuda", SHAPE, lambda module: True)  # as `_load` calls it
    assert in_cell is not None and in_cell.startswith(LAUNCHER_REASON_PREFIX) and "this machine lacks" in in_cell
    assert skip_reason(EAGER, "cuda", SHAPE, lambda module: True) is None  # eager cells launch no Triton kernel
    assert skip_reason(replace(COMPILED, dtype="float32"), "cpu", SHAPE, lambda module: True) is None


def test_a_given_verdict_skips_compiled_cuda_cells_only():
    def bare():
        return launcher_problem(NO_COMPILER)

    reason = skip_reason(COMPILED, "cuda", SHAPE, lambda module: True, launcher=bare)
    assert reason is not None and reason.startswith(LAUNCHER_REASON_PREFIX)
    assert skip_reason(EAGER, "cuda", SHAPE, lambda module: True, launcher=bare) is None
    assert not plan_cell(COMPILED, "cuda", SHAPE, launcher=bare).runs
    assert skip_reason(COMPILED, "cuda", SHAPE, lambda module: True, launcher=None) is None


def test_one_node_lacking_the_toolchain_skips_every_compiled_cell_with_its_reason():
    """A cell may land on any GPU node, so one node that cannot build the launcher skips them all."""
    already = PlannedCell(replace(COMPILED, context_length=512), "predicted oom: needs 99.0 GB")
    planned = [PlannedCell(COMPILED, None), PlannedCell(EAGER, None), already]
    first = launcher_problem(NO_COMPILER, where="node 10.0.0.5")
    second = launcher_problem(NO_COMPILER, where="node 10.0.0.6")
    assert first is not None and second is not None
    after = skip_compiled(planned, [first, second], nodes=3)
    assert after[0].skip_reason == f"{first} (1 more of the 3 GPU nodes lack some of it too)"
    assert after[0].skip_reason.startswith(LAUNCHER_REASON_PREFIX) and "node 10.0.0.5 lacks" in after[0].skip_reason
    assert after[1].runs and after[2] == already  # eager cells run; an earlier reason stays
    assert skip_compiled(planned, [], nodes=3) == planned


def test_each_node_is_asked_in_a_ray_task_and_names_itself(ray_cluster):
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    said: list[str] = []
    problems = launcher_problems(nodes, said.append, functools.partial(launcher_problem, NO_COMPILER))
    address = nodes[0]["NodeManagerAddress"]
    assert problems == [launcher_problem(NO_COMPILER, where=f"node {address}")]
    assert said == problems
    said.clear()
    assert launcher_problems(nodes, said.append, functools.partial(launcher_problem, COMPLETE)) == []
    assert said == [f"Triton's launcher toolchain (compiled CUDA cells): present on all {len(nodes)} GPU node(s)"]


@pytest.mark.slow
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
