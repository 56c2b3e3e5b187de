"""The sweep's parts built directly, without the command line: the OOM pruner, the scheduler, the sink.

Each is a stage of `run_sweep` a user never calls alone, but whose rules a user relies on: a cell
larger than one that ran out of memory is not run; every queued cell gets exactly one result, a
hung one after its retries; a result reaches MLflow, or stays queued while MLflow is down.
"""

import shutil
import time

import pytest
from mlflow import MlflowClient

from conftest import free_port
from kvsweep.driver.job_sources import OomPruner
from kvsweep.driver.ray_session import CellNeeds
from kvsweep.driver.scheduler import CellScheduler, Job, Limits
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.results import OK, OOM, TIMEOUT, CellResult
from kvsweep.testing.testing_config import Seams
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import Journal, SweepHeader
from kvsweep.tracking.sink import MlflowSink

PROTOCOL = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
STAND_IN = "kvsweep.testing.stand_ins:sleep_cell"


def job(cache: str = "dynamic", context: int = 64, batch: int = 1) -> Job:
    cell = Cell("tiny-llama", "float32", context, batch, 4, cache, False)
    return Job(cell_id(cell, PROTOCOL), cell)


def test_the_pruner_records_larger_cells_of_an_oomed_family_without_running_them():
    pruner = OomPruner(enabled=True)
    small = job("static", 64, 1)
    pruner.observe(CellResult(small.cell_id, small.cell, OOM, tags={"kvsweep.oom_kind": "host"}))
    inferred = pruner.admit(job("static", 128, 2))  # larger on every size axis, same model/dtype/cache
    assert inferred is not None and inferred.status == OOM and inferred.tags["kvsweep.oom_kind"] == "host"
    assert "ctx=64 bs=1" in inferred.error
    assert pruner.admit(job("static", 32, 4)) is None  # smaller context: it may fit
    assert pruner.admit(job("dynamic", 128, 2)) is None  # another cache: its own memory
    assert OomPruner(enabled=False).admit(job("static", 128, 2)) is None  # infer_oom=false runs everything


def scheduler(ray_cluster, sleep_s: float, timeout_s: float, retries: int) -> CellScheduler:
    limits = Limits(CellNeeds(gpus=0, cpus=1), max_concurrent=2, cell_timeout_s=timeout_s, max_retries=retries)
    return CellScheduler(PROTOCOL, limits, Seams(runner=STAND_IN, sleep_s=sleep_s))


def test_the_scheduler_gives_every_cell_exactly_one_result(ray_cluster):
    jobs = [job(context=c) for c in (64, 128, 256)]
    results: list[CellResult] = []
    started: list[str] = []
    scheduler(ray_cluster, 0.2, 120, 0).run(jobs, results.append, lambda j: started.append(j.cell_id))
    assert sorted(r.cell_id for r in results) == sorted(j.cell_id for j in jobs)
    assert {r.status for r in results} == {OK} and sorted(started) == sorted(j.cell_id for j in jobs)


@pytest.mark.heavy  # multi-process reliability: a hung actor killed at its timeout
def test_a_hung_cell_is_killed_at_its_timeout_retried_once_then_recorded(ray_cluster):
    results: list[CellResult] = []
    began = time.monotonic()
    scheduler(ray_cluster, 60, 3, 1).run([job()], results.append)
    assert [(r.status, r.attempt) for r in results] == [(TIMEOUT, 2)]  # one retry in a fresh actor, then given up
    assert time.monotonic() - began < 45  # two 3 s timeouts plus actor starts, not the 60 s sleep


def header(uri: str) -> SweepHeader:
    return SweepHeader("parts", "key-1", "kvsweep", uri, "cpu", "name: parts\n", {"name": "parts"})


def test_the_sink_sends_a_result_to_mlflow(migrated_store, tmp_path):
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    journal = Journal(tmp_path / "run")
    said: list[str] = []
    sink = MlflowSink(SweepTracker(uri, "kvsweep"), journal, header(uri), said.append)
    assert sink.open(resume=True) == {}  # nothing to resume in a fresh store
    done = job()
    sink.started(done.cell_id, done.cell)
    sink.finished(CellResult(done.cell_id, done.cell, OK, metrics={"tpot_ms": 2.5}))
    assert sink.close("FINISHED", {"ok": 1}) == 0 and not said
    child = MlflowClient(uri).get_run(sink.cell_runs[done.cell_id])
    assert child.data.tags["kvsweep.status"] == OK and child.data.metrics["tpot_ms"] == 2.5
    assert child.data.tags["mlflow.parentRunId"] == sink.parent_run_id


@pytest.mark.heavy  # multi-process reliability: MLflow down; waits out the sink's own HTTP retries, 6 s
def test_the_sink_keeps_results_queued_while_mlflow_is_down(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    said: list[str] = []
    sink = MlflowSink(SweepTracker(uri, "kvsweep"), Journal(tmp_path / "run"), header(uri), said.append)
    sink.open(resume=True)
    for c in (64, 128):
        done = job(context=c)
        sink.finished(CellResult(done.cell_id, done.cell, OK))
    assert len(sink.pending) == 2 and sink.down
    assert len([s for s in said if "MLflow is not answering" in s]) == 1  # said once, not per result
    assert sink.close("FINISHED", {"ok": 2}) == 2  # both left for `python -m kvsweep sync`
