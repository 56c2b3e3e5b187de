"""Two identical `python -m kvsweep` started together against one real `mlflow server` never log a cell twice.

Real processes, each with its own local Ray and run folder, one plain MLflow server on 127.0.0.1 (each
test its own experiment). Cells are the stand-in runner's sleeps, so the first sweep is still measuring
when the second decides. One sweep measures; the other refuses in one line naming the first's host and
pid, exit 2; a sweep killed with SIGKILL is resumed by the next, by one of two rivals only. An owner stopped
(SIGSTOP) or cut off from MLflow past its lease, then let go on, sends nothing more once another sweep took the
parent: it ends in one line naming the new owner; a resume that fails half-way lets its parent go and tries again.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import FAST, cell_runs

pytestmark = pytest.mark.heavy  # multi-process reliability: the heavy tier (CONTRIBUTING.md)

CELLS = ("grid.caches=[dynamic,static]", "grid.context_lengths=[64,128]")  # 4 cells
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def start(
    tmp_path: Path, name: str, server: str, experiment: str, *extra: str, cells: tuple[str, ...] = CELLS
) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "kvsweep",
        *FAST,
        *cells,
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


EIGHT = ("grid.caches=[dynamic,static]", "grid.context_lengths=[64,128,192,256]")
LEASE = "+testing.lease={period_s: 4, by_pid: false}"  # judged by its heartbeat, as from another host


def wait_for(what, condition, proc: subprocess.Popen, limit_s: float = 300) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def leased_to(server: str, experiment: str, pid: int) -> bool:
    """Whether the sweep's parent is leased to process `pid`, which has renewed it once (it holds it)."""
    parents, _ = cell_runs(server, experiment)
    tags = parents[0].data.tags if len(parents) == 1 else {}
    owner, beat = tags.get("kvsweep.lease_owner", ""), tags.get("kvsweep.lease_heartbeat", "")
    return f" pid={pid} " in owner and not beat.endswith("#0")


def took_over(server: str, experiment: str, lost: subprocess.Popen, rival: subprocess.Popen) -> None:
    """The sweep that lost its lease ends in one line naming the rival (exit 2); the rival measured every cell;
    the parent holds one run per cell, each ok."""
    lost_code, lost_out, lost_err = finish(lost)
    rival_code, rival_out, rival_err = finish(rival)
    assert rival_code == 0, rival_out + rival_err
    assert lost_code == 2, lost_out + lost_err
    lines = [line for line in lost_err.splitlines() if "now belongs to" in line]
    assert len(lines) == 1, lost_err
    assert f"host {socket.gethostname()} (pid {rival.pid})" in lines[0] and "journal.jsonl" in lines[0]
    [(_, runs)] = one_run_per_cell(server, experiment).items()
    assert len(runs) == 8 and {c.data.tags["kvsweep.status"] for c in runs} == {"ok"}


@pytest.mark.slow
def test_an_owner_stopped_past_its_lease_sends_nothing_once_continued(mlflow_server, tmp_path):
    """A stalled host (SIGSTOP of the sweep and its Ray) past its 4 s lease: a second sweep resumes the parent;
    continued, the first finds the parent another's before its next send and stops."""
    experiment = "stopped"
    paused = start(tmp_path, "paused", mlflow_server, experiment, "+testing.sleep_s=3", LEASE, cells=EIGHT)
    wait_for("a first cell", lambda: finished_in_mlflow(mlflow_server, experiment) >= 1, paused)
    os.killpg(paused.pid, signal.SIGSTOP)
    try:
        rival = start(tmp_path, "rival", mlflow_server, experiment, "+testing.sleep_s=3", LEASE, cells=EIGHT)
        wait_for("the rival's lease", lambda: leased_to(mlflow_server, experiment, rival.pid), rival)
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    took_over(mlflow_server, experiment, paused, rival)


class Proxy:
    """A TCP proxy to the MLflow server that can be cut (every connection reset, new ones refused) and restored:
    a network partition between one sweep and MLflow, while another sweep reaches MLflow directly."""

    def __init__(self, target: str) -> None:
        self.target = ("127.0.0.1", int(target.rsplit(":", 1)[1]))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.up = threading.Event()
        self.up.set()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if not self.up.is_set():
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up.clear()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.up.set()


@pytest.mark.slow
def test_an_owner_cut_off_from_mlflow_past_its_lease_sends_nothing_once_restored(mlflow_server, tmp_path):
    """The first sweep's MLflow traffic goes through a proxy that is cut after its first cell: its results queue
    in its journal while a second sweep, reaching MLflow directly, resumes the parent. Restored, the first finds
    the parent another's and stops; `sync` of its journal then sends nothing the parent lacks."""
    experiment = "partitioned"
    proxy = Proxy(mlflow_server)
    cut_off = start(tmp_path, "cut", proxy.url, experiment, "+testing.sleep_s=4", LEASE, cells=EIGHT)
    wait_for("a first cell", lambda: finished_in_mlflow(mlflow_server, experiment) >= 1, cut_off)
    proxy.cut()
    try:
        rival = start(tmp_path, "rival", mlflow_server, experiment, "+testing.sleep_s=3", LEASE, cells=EIGHT)
        wait_for("the rival's lease", lambda: leased_to(mlflow_server, experiment, rival.pid), rival)
    finally:
        proxy.restore()
    took_over(mlflow_server, experiment, cut_off, rival)
    synced = subprocess.run(
        [sys.executable, "-m", "kvsweep", "sync", str(tmp_path / "cut"), "--tracking-uri", mlflow_server],
        capture_output=True,
        text=True,
        env={**os.environ, **QUIET},
    )
    assert synced.returncode == 0, synced.stdout + synced.stderr
    [(_, runs)] = one_run_per_cell(mlflow_server, experiment).items()
    assert len(runs) == 8


@pytest.mark.slow
@pytest.mark.parametrize("failures", [1, 2])
def test_a_resume_that_fails_half_way_never_opens_a_cell_twice(mlflow_server, tmp_path, failures):
    """A parent with some cells done; the resuming sweep's first read of its cells fails (a dropped request):
    it lets the parent go and tries again, resuming it (one failure); failing twice, it measures every cell
    under a parent of its own. Either way no parent holds a cell twice."""
    experiment = f"half-open-{failures}"
    killed = start(tmp_path, "killed", mlflow_server, experiment, "+testing.sleep_s=3")
    wait_for("a first cell", lambda: finished_in_mlflow(mlflow_server, experiment) >= 1, killed)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    [(parent, before)] = one_run_per_cell(mlflow_server, experiment).items()
    done = {c.data.tags["kvsweep.cell_id"] for c in before if "kvsweep.status" in c.data.tags}
    assert 1 <= len(done) < 4

    fault = f"+testing.mlflow_faults={{child_runs: {failures}}}"
    code, out, err = finish(start(tmp_path, "resumed", mlflow_server, experiment, "+testing.sleep_s=1", fault))
    assert code == 0, out + err
    assert f"resuming parent run {parent} failed half-way" in out
    by_parent = one_run_per_cell(mlflow_server, experiment)
    if failures == 1:
        assert list(by_parent) == [parent] and f"resuming: {len(done)} of 4 cells" in out
        assert len(by_parent[parent]) == 4
    else:
        [fresh] = [p for p in by_parent if p != parent]
        assert len(by_parent[fresh]) == 4 and "resuming:" not in out
        assert len(by_parent[parent]) == len(before)  # the old parent left as it was
    finished_runs = [c for runs in by_parent.values() for c in runs if "kvsweep.status" in c.data.tags]
    assert {c.data.tags["kvsweep.status"] for c in finished_runs} == {"ok"}
