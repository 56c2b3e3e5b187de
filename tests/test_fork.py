"""Cells measured in fresh processes forked from a warm per-node template (issue 14's guarantees).

Each cell's process is new (never ran another cell), sees its actor's view of the machine (threads,
CPUs, CUDA_VISIBLE_DEVICES), dies with its actor, and comes from a template that never initialised
CUDA. On this CPU-only machine the CUDA check can only confirm the absence; `scripts/gpu_smoke.sh`
repeats it where a GPU exists.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, cell_is_running, wait_until
from kvsweep.cell.template import CellTemplate
from kvsweep.tracking.journal import Journal

QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
STATE = ("+testing.runner=kvsweep.testing.stand_ins:state_cell", "grid.caches=[dynamic,static]")


def found_states(run) -> list[dict]:
    """What each cell found in its process, in the order the cells ran (from the sweep's journal)."""
    results = Journal(run.run_dir).read().results
    return [{**r.environment["found"], "template": r.environment.get("template", "")} for r in results]


@pytest.mark.slow
def test_the_template_preloads_without_initialising_cuda():
    template = CellTemplate()
    state = template.ready()
    assert state["preloaded"]  # the heavy imports happened before the fork, not in each cell
    assert not state["cuda_initialized"] and not state["libcuda_mapped"]


def test_no_state_crosses_from_one_cell_to_the_next(run_sweep):
    run = run_sweep(*STATE)
    assert run.code == 0, run.out + run.err
    first, second = found_states(run)
    assert first["pid"] != second["pid"]  # a fresh process each ...
    assert first["template"] == second["template"] != ""  # ... forked from the same warm template
    for state in (first, second):
        assert state["left_behind"] == 0 and state["compiled_graphs"] == 0
    assert second["threads"] == first["threads"]  # the first cell's set_num_threads(n + 1) did not leak


def test_a_forked_cell_sees_what_a_fresh_process_would(run_sweep):
    forked = found_states(run_sweep(*STATE))[0]
    fresh = found_states(run_sweep(*STATE, "ray.fork_cells=false", experiment="own-process"))[0]
    assert fresh["template"] == ""  # measured in the actor's own process
    for key in ("threads", "cpus", "omp_num_threads", "cuda_visible_devices"):
        assert forked[key] == fresh[key], key


def _forked_processes() -> set[int]:
    """Processes forked by a multiprocessing forkserver (the template and its cells)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"multiprocessing.forkserver" in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.heavy  # multi-process reliability: a sweep killed with SIGKILL
def test_a_killed_sweep_leaves_no_forked_process_behind(tmp_path):
    before = _forked_processes()
    hang = "+testing.faults=[{match: {cache: static}, fault: hang}]"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvsweep",
            *FAST,
            "grid.caches=[dynamic,static]",
            hang,
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.run.dir={tmp_path}/a",
        ],
        cwd=tmp_path,
        env={**os.environ, **QUIET},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    journal = tmp_path / "a" / "journal.jsonl"
    wait_until(lambda: journal.exists() and Journal(journal.parent).read().results, "the dynamic cell's result", proc)
    wait_until(lambda: cell_is_running(uri, cache="static"), "the hung static cell", proc)
    wait_until(lambda: _forked_processes() - before, "the hung cell's forked process", proc)
    proc.terminate()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _forked_processes() - before:
        time.sleep(0.5)
    assert not (_forked_processes() - before), _forked_processes() - before


def test_a_cells_result_is_plain_data_that_imports_nothing_to_read():
    """The actor and the driver never import torch: a torch object in a result (a TorchVersion) would
    make every unpickling import it, seconds per cell (found by the overhead benchmark)."""
    import pickle
    import pickletools

    from kvsweep.grid import Cell, MeasureProtocol
    from kvsweep_testkit.cells import measure_cell

    cell = Cell("tiny-llama", "float32", 64, 1, 4, "static", False)
    result = measure_cell(
        cell.to_dict(), MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1).to_dict()
    )
    assert result["status"] == "ok", result["error"]
    ops = {op.name for op, _, _ in pickletools.genops(pickle.dumps(result))}
    assert not ops & {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "REDUCE"}, ops


def test_host_oom_kills_are_read_from_the_processs_memory_cgroup(tmp_path):
    """A forked cell killed by SIGKILL is a host OOM when its cgroup's `oom_kill` count rose (kernel docs:
    cgroup v2 `memory.events`, v1 `memory.oom_control`)."""
    from kvsweep.cell.process import oom_kills

    v2 = tmp_path / "v2"
    (v2 / "kvsweep.slice").mkdir(parents=True)
    (v2 / "kvsweep.slice" / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 3\n")
    (tmp_path / "cgroup2").write_text("0::/kvsweep.slice\n")
    assert oom_kills(v2, tmp_path / "cgroup2") == 3
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (tmp_path / "cgroup1").write_text("5:cpu:/\n4:memory:/job\n")
    assert oom_kills(v1, tmp_path / "cgroup1") == 1
    assert oom_kills(tmp_path / "nothing", tmp_path / "cgroup1") is None  # unreadable: unknown, never 0
