"""Two identical `python -m kvsweep` started together against one real `mlflow server` never log a cell twice.

Real processes, each with its own local Ray and run folder, one plain MLflow server on 127.0.0.1 (each
test its own experiment). Cells are the stand-in runner's sleeps, so the first sweep is still measuring
when the second decides. One sweep measures; the other refuses in one line naming the first's host and
pid, exit 2; a sweep killed with SIGKILL is resumed by the next, by one of two rivals only.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, cell_runs

pytestmark = pytest.mark.heavy  # multi-process reliability: the heavy tier (CONTRIBUTING.md)

CELLS = ("grid.caches=[dynamic,static]", "grid.context_lengths=[64,128]")  # 4 cells
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def start(tmp_path: Path, name: str, server: str, experiment: str, *extra: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "kvsweep",
        *FAST,
        *CELLS,
        "ray.fork_cells=false",
        "+testing.runner=kvsweep.testing.stand_ins:sleep_cell",
        f"mlflow.tracking_uri={server}",
        f"mlflow.experiment={experiment}",
        f"hydra.run.dir={tmp_path / name}",
        *extra,
    ]
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**os.environ, **QUIET},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its Ray processes with it, for a SIGKILL of the whole group
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=400)
    return proc.returncode, out, err


def one_run_per_cell(server: str, experiment: str) -> dict[str, list]:
    """Each live parent's cell runs; asserts no parent holds two runs of one cell."""
    parents, children = cell_runs(server, experiment)
    by_parent = {
        p.info.run_id: [c for c in children if c.data.tags["mlflow.parentRunId"] == p.info.run_id] for p in parents
    }
    for parent, runs in by_parent.items():
        ids = [c.data.tags["kvsweep.cell_id"] for c in runs]
        assert len(ids) == len(set(ids)), f"parent {parent} holds a cell twice: {sorted(ids)}"
    return by_parent


def finished_in_mlflow(server: str, experiment: str) -> int:
    """How many cells of the experiment MLflow holds with a status (0 while it does not exist yet)."""
    from mlflow import MlflowClient

    if MlflowClient(tracking_uri=server).get_experiment_by_name(experiment) is None:
        return 0
    _, children = cell_runs(server, experiment)
    return sum("kvsweep.status" in c.data.tags for c in children)


def two_at_once(tmp_path: Path, server: str, experiment: str, gap_s: float, *extra: str) -> str:
    """Two identical sweeps `gap_s` apart: one measures (exit 0), the other refuses in one line naming the
    first's host and pid (exit 2) having measured nothing. The one that measured's output."""
    first = start(tmp_path, "first", server, experiment, "+testing.sleep_s=3", *extra)
    time.sleep(gap_s)
    second = start(tmp_path, "second", server, experiment, "+testing.sleep_s=3", *extra)
    outcomes = {first: finish(first), second: finish(second)}
    measured = [p for p, (code, _, _) in outcomes.items() if code == 0]
    assert len(measured) == 1, outcomes
    [winner] = measured
    [(code, out, err)] = [outcome for p, outcome in outcomes.items() if p is not winner]
    assert code == 2, out + err
    lines = [line for line in err.splitlines() if "already running" in line]
    assert len(lines) == 1, err
    assert f"on host {socket.gethostname()} (pid {winner.pid})" in lines[0] and "rerun=true" in lines[0]
    assert "ok:" not in out  # it measured nothing
    return outcomes[winner][1]


@pytest.mark.slow
@pytest.mark.parametrize("gap_s", [0.0, 2.0])
def test_two_identical_sweeps_started_apart_measure_each_cell_once(mlflow_server, tmp_path, gap_s):
    experiment = f"together-{gap_s:g}"
    out = two_at_once(tmp_path, mlflow_server, experiment, gap_s)
    by_parent = one_run_per_cell(mlflow_server, experiment)
    assert len(by_parent) == 1  # the refused sweep left no parent behind
    [(parent, runs)] = by_parent.items()
    assert f"parent run {parent}" in out
    assert len(runs) == 4 and {c.data.tags["kvsweep.status"] for c in runs} == {"ok"}


@pytest.mark.slow
@pytest.mark.parametrize("by_pid", [True, False], ids=["same-host", "as-from-elsewhere"])
def test_after_sigkill_one_of_two_restarts_resumes_the_parent(mlflow_server, tmp_path, by_pid):
    """The killed sweep's lease is judged by its dead process (same host), or by its heartbeat that stopped
    (as from another host: a 4 s lease through the testing seam); two restarts 1 s apart, one resumes."""
    experiment = f"restart-{by_pid}"
    lease = [f"+testing.lease={{period_s: 4, by_pid: {str(by_pid).lower()}}}"]
    killed = start(tmp_path, "killed", mlflow_server, experiment, "+testing.sleep_s=4", *lease)
    deadline = time.monotonic() + 300
    while not finished_in_mlflow(mlflow_server, experiment):  # the journal alone may be ahead of MLflow's sink
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()
        time.sleep(0.3)
    os.killpg(killed.pid, signal.SIGKILL)  # the driver and its Ray: no chance to release the lease
    killed.wait(timeout=30)
    [(parent, before)] = one_run_per_cell(mlflow_server, experiment).items()
    done_before = {c.data.tags["kvsweep.cell_id"] for c in before if "kvsweep.status" in c.data.tags}
    assert 1 <= len(done_before) < 4, done_before  # killed mid-sweep, with something to resume

    out = two_at_once(tmp_path, mlflow_server, experiment, 1.0, *lease)
    assert f"resuming: {len(done_before)} of 4 cells" in out
    by_parent = one_run_per_cell(mlflow_server, experiment)
    assert list(by_parent) == [parent]  # the killed sweep's parent, resumed
    runs = by_parent[parent]
    assert len(runs) == 4 and {c.data.tags["kvsweep.status"] for c in runs} == {"ok"}
    if not by_pid:
        assert "watching its heartbeat" in out
