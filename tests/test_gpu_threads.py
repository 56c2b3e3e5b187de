"""Threads of GPU cells: concurrent cells on one node share its cores instead of each taking all of them.

The thread count is a pure function of the cell's device, `measure.threads`, the CPUs Ray reserved
for it (`ray.cpus_per_cell`, or the `OMP_NUM_THREADS` Ray sets from them) and its CPU affinity; the
auto `ray.cpus_per_cell` is a pure function of the cluster's nodes. Both are checked here against
node shapes written out by hand, and the cell runner is checked to set and record what they decide.
"""

import os

import pytest
import torch

from kvsweep.cell.cpu_slots import Threads, resolve_threads
from kvsweep.driver.actor_placement import GPU_CELL_MAX_CPUS, auto_cpus_per_cell, with_cpus_resolved
from kvsweep.driver.ray_session import CellNeeds
from kvsweep.grid import MeasureProtocol
from kvsweep_testkit.cells import measure_cell

# Auto CPUs per GPU cell: (node CPUs - 1) x GPUs per cell // node GPUs, one core left per node for Ray.
H100_NODE = {"CPU": 16.0, "GPU": 8.0, "accelerator_type:H100": 8.0}  # 15 // 8 = 1 per GPU
BIG_NODE = {"CPU": 192.0, "GPU": 8.0}  # 191 // 8 = 23 per GPU
CPU_NODE = {"CPU": 64.0}


def gpu_cell(gpus: int = 1, cpus: int = 0, **kw) -> CellNeeds:
    return CellNeeds(gpus=gpus, cpus=cpus, **kw)


def test_eight_gpu_cells_on_one_node_use_its_cores_once_not_once_each():
    cores = 16
    per_cell = auto_cpus_per_cell(gpu_cell(), [H100_NODE])
    threads = [resolve_threads("cuda", 0, per_cell, str(per_cell), cores).count for _ in range(8)]
    assert sum(threads) <= cores - 1  # before: 8 cells x 16 threads = 128 threads on 16 cores
    assert threads == [1] * 8  # each its whole share: 15 // 8 = 1; 8 cores lent, 8 left for Ray and the rest


@pytest.mark.parametrize(
    ("nodes", "gpus", "expected"),
    [
        ([H100_NODE], 1, 1),  # (16 - 1) // 8
        ([H100_NODE], 2, 3),  # a cell holding two GPUs gets two GPUs' share: 15 x 2 // 8
        ([{"CPU": 16.0, "GPU": 1.0}], 1, GPU_CELL_MAX_CPUS),  # 15 for one GPU is more than a cell can use
        ([BIG_NODE], 1, GPU_CELL_MAX_CPUS),  # 23 per GPU, likewise
        ([{"CPU": 2.0, "GPU": 1.0}], 1, 1),  # 2 - 1: one for the cell, one for Ray
        ([{"CPU": 4.0, "GPU": 8.0}], 1, 1),  # fewer CPUs than GPUs (3 // 8 = 0): at least one each
        ([BIG_NODE, {"CPU": 25.0, "GPU": 8.0}], 1, 3),  # the leanest GPU node decides (24 // 8): every GPU usable
        ([H100_NODE, CPU_NODE], 1, 1),  # a node without GPUs never holds a GPU cell
        ([{"CPU": 0.0, "GPU": 2.0}, BIG_NODE], 1, GPU_CELL_MAX_CPUS),  # nor does one without CPUs
    ],
)
def test_auto_cpus_per_gpu_cell_is_the_nodes_cpus_per_gpu(nodes, gpus, expected):
    assert auto_cpus_per_cell(gpu_cell(gpus), nodes) == expected


def test_auto_cpus_count_only_nodes_the_cell_may_run_on():
    h100 = {"CPU": 49.0, "GPU": 8.0, "accelerator_type:H100": 8.0}  # 48 // 8 = 6 per GPU
    a100 = {"CPU": 17.0, "GPU": 8.0, "accelerator_type:A100": 8.0}  # 16 // 8 = 2 per GPU, but not an H100
    assert auto_cpus_per_cell(gpu_cell(accelerator_type="H100"), [h100, a100]) == 6
    assert auto_cpus_per_cell(gpu_cell(), [h100, a100]) == 2  # any GPU: the A100 node counts
    nvme = {"CPU": 29.0, "GPU": 4.0, "nvme": 1.0}  # 28 // 4 = 7 per GPU
    assert auto_cpus_per_cell(gpu_cell(resources={"nvme": 1.0}), [H100_NODE, nvme]) == 7


def test_every_gpu_of_every_node_can_hold_a_cell_with_the_auto_cpus_and_one_core_stays_free():
    shapes = [H100_NODE, BIG_NODE, {"CPU": 12.0, "GPU": 3.0}, {"CPU": 10.0, "GPU": 4.0}, {"CPU": 2.0, "GPU": 1.0}]
    for gpus in (1, 2):
        for node in shapes:
            cpus = auto_cpus_per_cell(gpu_cell(gpus), [node])
            cells = int(node["GPU"]) // gpus
            assert cells * cpus <= node["CPU"] - 1, (node, gpus, cpus)  # one core for Ray's daemons, the driver


def test_cpu_cells_and_explicit_settings_keep_their_cpus():
    assert auto_cpus_per_cell(CellNeeds(gpus=0, cpus=0), [CPU_NODE]) == 1  # as before: Ray reserves one
    assert with_cpus_resolved(gpu_cell(cpus=6), [H100_NODE]).cpus == 6  # an explicit count is kept
    assert with_cpus_resolved(gpu_cell(cpus=2), [H100_NODE]).cpus == 2  # even where auto would give 1
    assert with_cpus_resolved(gpu_cell(cpus=0), [H100_NODE]).cpus == 1


def test_thread_count_rules():
    # measure.threads > 0 is taken as it is, on either device
    assert resolve_threads("cuda", 3, 2, "2", 16) == Threads(3, "measure.threads")
    assert resolve_threads("cpu", 3, 1, "1", 16) == Threads(3, "measure.threads")
    # a CPU cell computes on every core it may use, whatever Ray reserved (Ray's OMP_NUM_THREADS=1)
    assert resolve_threads("cpu", 0, 1, "1", 16) == Threads(16, "cpu affinity")
    # a CUDA cell: the CPUs Ray reserved, else Ray's OMP_NUM_THREADS, never beyond its affinity
    assert resolve_threads("cuda", 0, 4, "1", 16) == Threads(4, "ray.cpus_per_cell")
    assert resolve_threads("cuda", 0, 0, "6", 16) == Threads(6, "OMP_NUM_THREADS")
    assert resolve_threads("cuda", 0, 8, None, 4) == Threads(4, "ray.cpus_per_cell")
    assert resolve_threads("cuda", 0, 0, "32", 4) == Threads(4, "OMP_NUM_THREADS")
    for unusable in (None, "", "0", "four", "-2"):  # outside Ray: every allowed core
        assert resolve_threads("cuda", 0, 0, unusable, 16) == Threads(16, "cpu affinity")


def test_the_cell_sets_and_records_the_threads_of_a_cuda_cell():
    """run_cell with cpus_per_cell=1 on CUDA: one thread, recorded with the result. Here (no GPU) the cell
    then fails to load, but its environment is recorded first; on a GPU machine it runs."""
    cell = {
        "model": "tiny-llama",
        "dtype": "float32",
        "context_length": 16,
        "batch_size": 1,
        "max_new_tokens": 2,
        "cache": "dynamic",
        "compile": False,
    }
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cuda", threads=0).to_dict()
    before = torch.get_num_threads()
    try:
        result = measure_cell(cell, protocol, cpus_per_cell=1)
        cpu_result = measure_cell(cell, {**protocol, "device": "cpu"}, cpus_per_cell=1)
    finally:
        torch.set_num_threads(before)
    assert result["environment"]["torch_threads"] == 1
    assert result["environment"]["threads_from"] == "ray.cpus_per_cell"
    cores = len(os.sched_getaffinity(0))
    assert cpu_result["environment"]["torch_threads"] == cores  # a CPU cell: all of them, as before
    assert cpu_result["environment"]["threads_from"] == "cpu affinity"
