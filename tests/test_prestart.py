"""Prestarted spare actors: without forking, the next cell runs in a fresh process that imported ahead,
never during a measurement; forked cells (the default) import nothing at all. GPU cells get no spares:
a spare would hold a GPU no cell measures on (or wait for one, gaining nothing)."""

import json
import os
import subprocess
import sys
from itertools import product

import pytest

from kvsweep.driver.ray_session import QUIET_ENV


def timelines(run_dir):
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    results = [json.loads(line)["result"] for line in lines if '"kind": "cell"' in line]
    return [r["environment"]["timeline"] for r in results]


def test_spares_run_the_next_cells_and_never_import_during_a_measured_phase(run_sweep):
    run = run_sweep("grid.caches=[dynamic,static,no_cache]", "ray.prestart=1", "ray.fork_cells=false")
    assert run.code == 0, run.out
    cells = timelines(run.run_dir)
    assert len(cells) == 3
    spares = [t for t in cells if "prepared_at" in t]
    assert len(spares) == 2  # every cell but the first ran in a spare
    for spare in spares:
        assert spare["prepared_at"] <= spare["run_at"]  # imported before its cell arrived
    for spare, cell in product(spares, cells):
        overlap = min(spare["prepared_at"], cell["measured_at"]) - max(spare["prepare_at"], cell["gate_passed_at"])
        assert overlap <= 0.05, (spare, cell)


def test_prestart_off_starts_every_actor_on_demand(run_sweep):
    run = run_sweep("grid.caches=[dynamic,static]", "ray.prestart=0")
    assert run.code == 0, run.out
    assert all("prepare_at" not in t for t in timelines(run.run_dir))


# Runs in its own process: a local Ray with 5 CPUs and 2 logical GPUs (this session's Ray has none).
# Two cells one at a time (max_concurrent=1, prestart=1, ray.cpus_per_cell auto), as GPU cells and
# as CPU cells; 1.5 s into each cell, the GPUs and CPUs Ray had free, as a cluster's other users see
# them. Then one GPU cell reports the threads its process got.
HELD_WHILE_RUNNING = """
import json, threading, time
import ray
from kvsweep.driver.ray_session import CellNeeds
from kvsweep.driver.scheduler import CellScheduler, Job, Limits
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.testing.testing_config import Seams

ray.init(address="local", num_cpus=5, num_gpus=2, include_dashboard=False, log_to_driver=False,
         object_store_memory=80 * 1024 * 1024, logging_level="ERROR")

def sweep(device, gpus, testing, cells=2):
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device=device, threads=0)
    jobs = [Job(cell_id(c, protocol), c) for c in
            [Cell("tiny-llama", "float32", 64 * (i + 1), 1, 4, "dynamic", False) for i in range(cells)]]
    limits = Limits(CellNeeds(gpus=gpus, cpus=0), max_concurrent=1, cell_timeout_s=120, max_retries=0, prestart=1)
    free, results = [], []

    def sample():
        now = ray.available_resources()
        free.append({key: now.get(key, 0.0) for key in ("GPU", "CPU")})

    def started(job):
        threading.Timer(1.5, sample).start()

    CellScheduler(protocol, limits, testing).run(jobs, results.append, started)
    time.sleep(0.1)
    return {"free": free, "statuses": [r.status for r in results],
            "found": [r.environment.get("found", {}) for r in results]}

sleep = Seams(runner="kvsweep.testing.stand_ins:sleep_cell", sleep_s=3)
seen = {"gpu": sweep("cuda", 1, sleep), "cpu": sweep("cpu", 0, sleep),
        "threads": sweep("cuda", 1, Seams(runner="kvsweep.testing.stand_ins:state_cell"), cells=1)}
print("RESULT " + json.dumps(seen))
"""


@pytest.mark.slow
def test_gpu_cells_hold_only_the_gpus_they_measure_on_while_cpu_cells_keep_their_spares():
    proc = subprocess.run(
        [sys.executable, "-c", HELD_WHILE_RUNNING],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **QUIET_ENV},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    seen = json.loads(lines[-1].removeprefix("RESULT "))
    for run in seen.values():
        assert run["statuses"] == ["ok"] * len(run["statuses"]), run
    # One GPU cell at a time on two GPUs: the other GPU stays free for others (a spare would hold it),
    # and the running cell holds its auto CPUs: one of the node's 5 kept for Ray and the driver, then
    # (5 - 1) // 2 GPUs = 2, no more; 5 - 2 = 3 stay free.
    assert seen["gpu"]["free"] == [{"GPU": 1.0, "CPU": 3.0}] * 2
    # CPU cells keep their spare: while the first runs (1 CPU), the spare for the second holds another.
    assert seen["cpu"]["free"][0] == {"GPU": 2.0, "CPU": 5.0 - 1 - 1}
    # Ray gives the GPU cell's process as many threads as it reserved CPUs for it.
    (found,) = seen["threads"]["found"]
    assert found["omp_num_threads"] == "2" and found["threads"] == 2
    assert found["cuda_visible_devices"] in ("0", "1")
