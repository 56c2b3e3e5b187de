"""CUDA cells on one node get cores of their own, and meter only those.

The slot bookkeeping is checked against node shapes written out by hand (an 8-GPU 16-core node, one
with hyperthreads, one with two NUMA nodes). Then, with the kernel's real counters, two concurrent
stand-in CUDA cells forked from this node's template: a sibling spinning on its own core is not the
other's contention, an outside burner on a cell's core is, and two CPU cells (no slots, as always)
do see each other.
"""

import os
import shutil
import subprocess
import time

import pytest

from conftest import burner_on
from kvsweep.cell.cpu_slots import AFFINITY, SLOT, CpuPlace, CpuSlots, cores_to_ask, read_places, shared
from kvsweep.cell.process import restart_nvml
from kvsweep.cell.request import CellRequest
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.testing.testing_config import Seams

ALIVE = 4242  # an owner pid the tests' `alive` says is running


def plain_node(cores: int) -> list[CpuPlace]:
    """One package, one NUMA node, no hyperthreads: every CPU its own core."""
    return [CpuPlace(0, (0, cpu), cpu) for cpu in range(cores)]


def always_alive(pid: int) -> bool:
    return True


def test_eight_cells_of_an_eight_gpu_node_get_eight_disjoint_pairs():
    # 16 CPUs, 8 GPUs, ray.cpus_per_cell=2 (auto would give 1 each, leaving cores to Ray): each cell asks for 2.
    slots = CpuSlots(plain_node(16), always_alive)
    grants = [slots.take(2, ALIVE + i) for i in range(8)]
    assert [g.cpus for g in grants] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]
    assert all(g.source == SLOT for g in grants)
    assert len({g.slot for g in grants}) == 8  # each its own id to give back
    ninth = slots.take(2, ALIVE + 8)  # more cells than the node has room for (Ray's CPUs > cores)
    assert ninth.cpus == () and ninth.slot == 0
    assert ninth.source == shared("0 of 16 cores free, 2 wanted")


def test_a_slot_given_back_is_lent_again_and_only_it():
    slots = CpuSlots(plain_node(4), always_alive)
    first, second = slots.take(2, ALIVE), slots.take(2, ALIVE)
    slots.release(first.slot)
    assert slots.held() == {second.slot: (2, 3)}
    assert slots.take(2, ALIVE).cpus == (0, 1)  # the freed pair, not a core of the running cell
    slots.release(first.slot)  # giving back twice (or slot 0: no slot) changes nothing
    slots.release(0)
    assert sorted(slots.held().values()) == [(0, 1), (2, 3)]


def test_a_dead_owners_slot_is_taken_back_at_the_next_request():
    running = {101, 102}
    slots = CpuSlots(plain_node(4), lambda pid: pid in running)
    killed = slots.take(2, 101)
    slots.take(2, 102)
    assert slots.take(2, 103).source.startswith("shared")  # full while both owners run
    running.discard(101)  # its actor was killed before it could give the slot back
    assert slots.take(2, 103).cpus == killed.cpus


def test_a_dead_owners_slot_stays_lent_while_its_cells_process_still_runs():
    running = {101}
    slots = CpuSlots(plain_node(2), lambda pid: pid in running)
    grant = slots.take(2, 101)
    with slots.in_measure(grant.slot):  # the template's `measure`: the cell's forked process runs on them
        running.discard(101)  # Ray killed the actor; the process has yet to notice, or tears CUDA down
        assert slots.take(2, 102).source == shared("0 of 2 cores free, 2 wanted")  # a retry must not get them
    assert slots.held() == {}  # the process has ended: the slot went back
    assert slots.take(2, 102).cpus == (0, 1)


def test_the_default_liveness_check_asks_the_kernel():
    gone = subprocess.Popen(["true"])
    gone.wait()
    slots = CpuSlots(plain_node(2))  # kernel's answer: os.kill(pid, 0)
    slots.take(2, gone.pid)  # a process that has exited
    assert slots.take(1, os.getpid()).cpus == (0,)  # its slot came back
    assert slots.take(1, os.getpid()).cpus == (1,)
    assert slots.take(1, os.getpid()).source.startswith("shared")  # this process is alive: its slots stay


def test_a_cell_wanting_more_cores_than_are_free_or_exist_gets_no_slot():
    slots = CpuSlots(plain_node(4), always_alive)
    assert slots.take(8, ALIVE).source == shared("4 of 4 cores free, 8 wanted")  # Ray's count above the cores
    slots.take(3, ALIVE)
    assert slots.take(2, ALIVE).source == shared("1 of 4 cores free, 2 wanted")
    assert slots.take(1, ALIVE).cpus == (3,)


def hyperthreaded_node() -> list[CpuPlace]:
    """8 physical cores, 2 threads each, numbered as Linux usually does: CPU i and i + 8 share core i."""
    return [CpuPlace(0, (0, cpu % 8), cpu) for cpu in range(16)]


def test_a_two_core_slot_is_one_physical_core_when_cores_are_hyperthreaded():
    slots = CpuSlots(hyperthreaded_node(), always_alive)
    grants = [slots.take(2, ALIVE).cpus for _ in range(8)]
    assert grants == [(0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)]


def test_one_core_slots_take_idle_physical_cores_before_a_busy_cores_twin():
    slots = CpuSlots(hyperthreaded_node(), always_alive)
    firsts = [slots.take(1, ALIVE).cpus for _ in range(8)]
    assert firsts == [(c,) for c in range(8)]  # one thread on each physical core first
    assert slots.take(1, ALIVE).cpus == (8,)  # then the twins


def test_a_slot_stays_on_one_numa_node_when_it_can():
    two_nodes = [CpuPlace(cpu // 4, (cpu // 4, cpu), cpu) for cpu in range(8)]  # CPUs 0-3 node 0, 4-7 node 1
    slots = CpuSlots(two_nodes, always_alive)
    assert slots.take(3, ALIVE).cpus == (0, 1, 2)
    assert slots.take(2, ALIVE).cpus == (4, 5)  # not (3, 4), across the nodes
    assert slots.take(2, ALIVE).cpus == (6, 7)
    assert slots.take(1, ALIVE).cpus == (3,)


def two_socket_node() -> list[CpuPlace]:
    """A two-socket 8-GPU node, 8 cores a socket: CPUs 0-7 on NUMA node 0 (GPUs 0-3), 8-15 on node 1 (GPUs 4-7)."""
    return [CpuPlace(cpu // 8, (cpu // 8, cpu % 8), cpu) for cpu in range(16)]


def test_a_cell_on_the_second_sockets_gpu_gets_that_sockets_cores():
    slots = CpuSlots(two_socket_node(), always_alive)
    on_gpu_5 = slots.take(2, ALIVE, near=1)
    assert on_gpu_5.cpus == (8, 9) and on_gpu_5.near == 1  # not (0, 1), across the socket link
    assert slots.take(2, ALIVE, near=0).cpus == (0, 1)
    assert slots.take(2, ALIVE, near=1).cpus == (10, 11)


def test_eight_cells_of_a_two_socket_node_each_sit_on_their_gpus_socket():
    slots = CpuSlots(two_socket_node(), always_alive)
    by_gpu = {gpu: slots.take(2, ALIVE + gpu, near=gpu // 4).cpus for gpu in (7, 0, 5, 2, 4, 1, 6, 3)}
    assert all({cpu // 8 for cpu in cpus} == {gpu // 4} for gpu, cpus in by_gpu.items()), by_gpu


def test_where_the_gpus_node_is_unknown_slots_come_as_before():
    slots = CpuSlots(two_socket_node(), always_alive)
    assert [slots.take(2, ALIVE, near=-1).cpus for _ in range(5)] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def test_a_full_gpu_socket_lends_the_other_sockets_cores():
    slots = CpuSlots(two_socket_node(), always_alive)
    for _ in range(4):
        slots.take(2, ALIVE, near=1)  # node 1 full
    fallback = slots.take(2, ALIVE, near=1)
    assert fallback.cpus == (0, 1) and fallback.source == SLOT  # a slot of its own still, on node 0
    assert slots.take(3, ALIVE, near=1).cpus == (2, 3, 4)  # still one node where it can


def test_cuda_cells_ask_for_the_cpus_ray_reserved_and_cpu_cells_for_none():
    assert cores_to_ask("cuda", 2.0, 2) == (2, "")  # Ray's assignment to the actor
    assert cores_to_ask("cuda", None, 3) == (3, "")  # else the driver's cpus_per_cell
    assert cores_to_ask("cuda", 0.5, 0) == (0, shared("Ray reserved 0.5 CPUs for the cell, less than one core"))
    assert cores_to_ask("cpu", 1.0, 1) == (0, AFFINITY)  # a CPU cell computes on every core it may use


def test_where_cpus_sit_is_read_from_the_kernels_topology_files(tmp_path):
    for cpu, package, core, node in ((0, 0, 0, 0), (1, 0, 1, 0), (2, 1, 0, 1), (3, 1, 0, 1)):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
        (tmp_path / f"cpu{cpu}" / f"node{node}").mkdir()
    places = read_places([0, 1, 2, 3, 4], root=str(tmp_path))  # CPU 4 has no files
    assert places == [
        CpuPlace(0, (0, 0), 0),
        CpuPlace(0, (0, 1), 1),
        CpuPlace(1, (1, 0), 2),
        CpuPlace(1, (1, 0), 3),  # CPU 2's hyperthread twin
        CpuPlace(0, (-1, 4), 4),  # unreadable: its own core
    ]


# --- two stand-in CUDA cells forked from this node's template, on the kernel's real counters ---

CPUS = sorted(os.sched_getaffinity(0))
BUSY_S = 1.5  # one tick per CPU is then 0.007 of the reading, well inside the 0.05 limit
LIMIT = 0.05  # the protocol's default max_host_contention
# The limit for cells on one core each of a two-core host. Ray's own processes (GCS, raylet, monitors),
# the template and the cells' actors take about 0.05-0.1 of a core together even when idle; a node
# keeps a core for them (the auto `ray.cpus_per_cell`), but here both cores are lent, so they land on
# the cells' cores: up to about 0.08 of one, as measured here. A process sharing the metered core takes
# about half of it (a sibling, were it metered; the burner): 0.2 tells the two apart with room to spare.
SLOT_LIMIT = 0.2
SETTLE_S = 1.0
# When the cells' metered windows open, from the moment their actors are asked to run: every cell's
# fork, unpickling and pinning is over by then, so no cell's start-up falls in another's window.
START_IN_S = 1.5
LATE_S = 0.1  # a window that opened later than this was not the others' window


def protocol(device: str) -> dict:
    limit = SLOT_LIMIT if device == "cuda" else LIMIT
    return MeasureProtocol.exact(0, 1, 0, device, threads=1).with_measure(max_host_contention=limit).to_dict()


def run_together(device: str, cells: int = 2) -> list[dict]:
    """`cells` concurrent stand-in cells, each in its own 1-CPU actor (a GPU cell on a node with one CPU
    per GPU), each keeping one core busy while it meters the CPUs it runs on, all over the same window."""
    import ray

    from kvsweep.cell.actor import CellActor

    actor_class = ray.remote(num_cpus=1, max_restarts=0)(CellActor)
    actors = [actor_class.remote("", time.time(), False) for _ in range(cells)]
    ray.get([a.ready.remote() for a in actors])  # started: the cells below begin together ...
    time.sleep(SETTLE_S)  # ... once Ray has replaced the idle workers they took (it starts Python processes)
    cell = Cell("tiny-llama", "float32", 64, 1, 4, "dynamic", False)
    start_at = time.time() + START_IN_S
    seams = Seams(runner="kvsweep.testing.stand_ins:busy_cell", sleep_s=BUSY_S, start_at=start_at)
    # No `cpus_per_cell` in the options: the slot's size is what Ray says it reserved for the actor.
    request = CellRequest(cell, MeasureProtocol.from_dict(protocol(device)), seams=seams)
    try:
        results = ray.get([a.run.remote(request, True) for a in actors])
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    assert all(r["status"] == "ok" for r in results), [r["error"] for r in results]
    late = [round(r["environment"]["metered_at"] - start_at, 3) for r in results]
    assert max(late) < LATE_S, f"a cell's window opened {max(late)} s late: the machine is too busy to tell"
    return results


def verdicts(results: list[dict]) -> dict[str, str]:
    """Each cell's contention verdict by the cores it ran on."""
    return {r["environment"]["cpus"]: r["tags"]["kvsweep.contended"] for r in results}


def shares(results: list[dict]) -> dict[str, float]:
    """What others took of each cell's cores, by the cores (for the failure message)."""
    return {r["environment"]["cpus"]: r["metrics"]["host_other_cpu_share"] for r in results}


@pytest.mark.skipif(len(CPUS) < 2, reason="two cells on disjoint cores need two CPUs")
def test_sibling_cuda_cells_on_their_own_cores_are_not_each_others_contention(cell_template):
    """Two CUDA cells, each spinning on a core of its own over the same window: neither reads the other
    as contention (before slots, each metered both cores and read the other as half of them)."""
    results = run_together("cuda")
    assert sorted(r["environment"]["cpus_from"] for r in results) == [SLOT, SLOT]
    assert verdicts(results) == {str(CPUS[0]): "false", str(CPUS[1]): "false"}, shares(results)
    # Each forked CUDA cell started NVML afresh, and came to what this process comes to (here: no NVML
    # library, so why not); with no GPU from Ray, its slot was asked to sit on no node in particular.
    assert [r["environment"]["nvml"] for r in results] == [restart_nvml()] * 2
    assert [r["environment"]["cpus_near_numa_node"] for r in results] == [-1, -1]


@pytest.mark.skipif(len(CPUS) < 2, reason="two cells on disjoint cores need two CPUs")
@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset pins the burner from its first instruction")
def test_an_outside_process_on_a_cuda_cells_own_core_is_still_its_contention(cell_template):
    """The same two cells, with a burner pinned to the second one's core: that cell shares its core with
    it, which takes about half of it, and must see it."""
    with burner_on(CPUS[1]):
        results = run_together("cuda")
    assert sorted(r["environment"]["cpus"] for r in results) == [str(CPUS[0]), str(CPUS[1])]  # disjoint
    assert verdicts(results)[str(CPUS[1])] == "true", shares(results)


@pytest.mark.skipif(len(CPUS) < 2, reason="two cells need two CPUs to overlap")
def test_cpu_cells_keep_metering_every_core_and_so_see_each_other(cell_template):
    """Without slots (a CPU cell, as always; a CUDA cell before slots) each cell meters all the cores and
    the sibling's spinning core is half of them: well over the limit."""
    results = run_together("cpu")
    every = ",".join(map(str, CPUS))
    assert [(r["environment"]["cpus"], r["environment"]["cpus_from"]) for r in results] == [(every, AFFINITY)] * 2
    assert set(verdicts(results).values()) == {"true"}
    assert not any("nvml" in r["environment"] for r in results)  # a CPU cell never touches NVML
    assert all(r["metrics"]["host_other_cpu_share"] > 0.2 for r in results)  # about 1/2 while they overlap
