"""Offloaded cells on one node share its host memory: their actors reserve their pinned blocks from Ray.

`memory_ask` is arithmetic on the cluster's node resources (no cluster needed); the scheduler tests
run stand-in cells on the session's real local Ray instance, whose `memory` resource is what this
machine had free when Ray started; another job holding memory is an idle actor that reserved it.
"""

import itertools

import pytest
import ray

from kvsweep.cell.actor import CellActor
from kvsweep.driver.actor_placement import memory_ask
from kvsweep.driver.ray_session import CellNeeds
from kvsweep.driver.scheduler import CellScheduler, Job, Limits
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.results import OK, TIMEOUT, CellResult
from kvsweep.testing.testing_config import Seams
from kvsweep.units import GB

GPU_NODE = {"CPU": 64.0, "GPU": 8.0, "memory": 1_000e9}
BIG_CPU_NODE = {"CPU": 128.0, "memory": 4_000e9}
GPU_CELL = CellNeeds(gpus=1, cpus=8)


def test_an_offloaded_cell_asks_for_its_pinned_bytes():
    assert memory_ask(103_079_215_104, GPU_CELL, [GPU_NODE]) == 103_079_215_104
    assert memory_ask(0, GPU_CELL, [GPU_NODE]) == 0  # not offloaded: no ask, as before


def test_an_ask_no_node_could_grant_is_cut_to_the_most_a_node_offers_so_it_never_waits_forever():
    assert memory_ask(1_500e9, GPU_CELL, [GPU_NODE]) == 1_000e9  # runs alone among offloaded cells
    # A node the cell cannot run on (no GPU) does not count, however much memory it has.
    assert memory_ask(1_500e9, GPU_CELL, [GPU_NODE, BIG_CPU_NODE]) == 1_000e9
    assert memory_ask(10e9, GPU_CELL, [{"CPU": 64.0, "GPU": 8.0}]) == 0  # no memory reported: no ask


def test_offloaded_cells_whose_blocks_together_exceed_a_node_run_one_after_the_other(ray_cluster):
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
    node_memory = max(n["Resources"].get("memory", 0.0) for n in ray.nodes() if n.get("Alive"))
    cells = [Cell("tiny-llama", "float32", c, 1, 4, "offloaded", False) for c in (64, 128, 256)]
    # Two cells of 60% of the node each, and one asking ten times what the node has (cut to all of it).
    asks = [int(0.6 * node_memory), int(0.6 * node_memory), int(10 * node_memory)]
    jobs = [Job(cell_id(c, protocol), c, host_memory_bytes=ask) for c, ask in zip(cells, asks, strict=True)]
    # Each sleeps 4 s; a cell waits about that long for the one before it. With its timeout counted from
    # the actor's creation, that wait would time the 7 s cells out; it counts from when Ray placed them.
    limits = Limits(CellNeeds(gpus=0, cpus=1), max_concurrent=3, cell_timeout_s=7, max_retries=0)
    testing = Seams(runner="kvsweep.testing.stand_ins:sleep_cell", sleep_s=4.0)
    results: list[CellResult] = []
    CellScheduler(protocol, limits, testing).run(jobs, results.append)
    assert [r.status for r in results] == [OK, OK, OK]
    spans = sorted((r.environment["started_at"], r.environment["ended_at"]) for r in results)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def memory_holder(ray_cluster, share: float) -> tuple[object, int]:
    """Another job on the node: an actor holding `share` of the node's Ray memory (a plain CellActor, idle)."""
    node_memory = max(n["Resources"].get("memory", 0.0) for n in ray.nodes() if n.get("Alive"))
    holder = ray.remote(CellActor).options(num_cpus=0, memory=int(share * node_memory)).remote()
    ray.get(holder.ready.remote(), timeout=60)
    return holder, int(node_memory)


@pytest.mark.heavy  # multi-process reliability: a cell Ray never places, timed out
def test_a_cell_left_waiting_for_memory_lets_cells_that_ask_none_run_then_times_out_saying_why(ray_cluster):
    holder, node_memory = memory_holder(ray_cluster, 0.6)
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
    offloaded = Cell("tiny-llama", "float32", 64, 1, 4, "offloaded", False)
    dense = [Cell("tiny-llama", "float32", c, 1, 4, "dynamic", False) for c in (128, 256)]
    # First in the queue, the offloaded cell asks for 60% of the node's memory while another job holds 60%.
    jobs = [Job(cell_id(offloaded, protocol), offloaded, host_memory_bytes=int(0.6 * node_memory))]
    jobs += [Job(cell_id(c, protocol), c) for c in dense]
    limits = Limits(CellNeeds(gpus=0, cpus=1), max_concurrent=1, cell_timeout_s=6, max_retries=0, placing_grace_s=0.5)
    testing = Seams(runner="kvsweep.testing.stand_ins:sleep_cell", sleep_s=1.0)
    results: list[CellResult] = []
    said: list[tuple[str, str]] = []
    try:
        CellScheduler(protocol, limits, testing).run(
            jobs, results.append, on_wait=lambda job, text: said.append((job.cell.cache, text))
        )
    finally:
        ray.kill(holder, no_restart=True)
    # Its one place went to the two dense cells, one after the other (max_concurrent=1 still holds) ...
    assert [(r.cell.cache, r.status) for r in results] == [("dynamic", OK), ("dynamic", OK), ("offloaded", TIMEOUT)]
    spans = sorted((r.environment["started_at"], r.environment["ended_at"]) for r in results[:2])
    assert spans[1][0] >= spans[0][1]
    # ... and it was given up 6 s after the last of them ended (each slept 1 s), not 6 s after it was made.
    timed_out = results[-1]
    assert timed_out.wall_s >= 6 + 2 * 1.0
    assert f"for {0.6 * node_memory / GB:.1f} GB of Ray memory on a node; none freed" in timed_out.error
    assert [cache for cache, _ in said] == ["offloaded"] and "waits for" in said[0][1]


def test_ctrl_c_while_a_cell_waits_for_memory_kills_it_and_withdraws_its_ask(ray_cluster):
    holder, node_memory = memory_holder(ray_cluster, 0.6)
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
    offloaded = Cell("tiny-llama", "float32", 64, 1, 4, "offloaded", False)
    job = Job(cell_id(offloaded, protocol), offloaded, host_memory_bytes=int(0.6 * node_memory))
    limits = Limits(CellNeeds(gpus=0, cpus=1), max_concurrent=1, cell_timeout_s=600, max_retries=0, placing_grace_s=0.5)
    scheduler = CellScheduler(protocol, limits, Seams(runner="kvsweep.testing.stand_ins:sleep_cell"))

    def interrupt(job: Job, text: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C arrives while Ray has yet to place the cell

    try:
        with pytest.raises(KeyboardInterrupt):
            scheduler.run([job], [].append, on_wait=interrupt)
        (run_ref,) = list(scheduler.running)
        assert scheduler.kill_all() == [job]  # reported as running, so the sweep marks it interrupted
    finally:
        ray.kill(holder, no_restart=True)
    # The memory is free now; had its request outlived Ctrl-C, Ray would place it and run the cell.
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(run_ref, timeout=60)
    assert scheduler.running == {}
