"""Which NUMA node a cell's GPUs hang off: sysfs trees and NVML written by hand (no GPU here).

A node's `/sys/bus/pci/devices/<bus id>/numa_node` files are made in a folder, NVML's answers come from a
stand-in for its bindings (`fake_nvml.py`), and the GPUs are named as Ray's `CUDA_VISIBLE_DEVICES` names
them (indices or UUIDs).
"""

from pathlib import Path

import pytest

from fake_nvml import FakeGpu, FakeNvml
from kvsweep.cell.environment import recorded_gpu_uuids
from kvsweep.cell.gpu_numa import (
    gpus_numa_nodes,
    nearest_node,
    pci_numa_node,
    sysfs_bus_id,
    visible_gpus_node,
)

# A two-socket node's four GPUs: two on each socket's PCIe root.
BUSES = {"0000:18:00.0": 0, "0000:3b:00.0": 0, "0000:86:00.0": 1, "0000:af:00.0": 1}


def sysfs(tmp_path: Path, nodes: dict[str, int | str]) -> str:
    for bus_id, node in nodes.items():
        (tmp_path / bus_id).mkdir(parents=True)
        (tmp_path / bus_id / "numa_node").write_text(f"{node}\n")
    return str(tmp_path)


def node_with_four_gpus() -> FakeNvml:
    """NVML's view: index i is the i-th GPU in PCI order, bus ids as NVML writes them."""
    return FakeNvml([FakeGpu(f"GPU-{i}", bus_id=f"0000{bus.upper()}") for i, bus in enumerate(BUSES)])


def test_nvmls_bus_id_is_found_under_the_name_sysfs_gives_it(tmp_path):
    assert sysfs_bus_id("00000000:AF:00.0") == "0000:af:00.0"
    assert sysfs_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    root = sysfs(tmp_path, {"0000:af:00.0": 1, "0000:18:00.0": -1})
    assert pci_numa_node("00000000:AF:00.0", root) == 1
    assert pci_numa_node("00000000:18:00.0", root) == -1  # the kernel does not know (one socket, a VM)
    assert pci_numa_node("00000000:99:00.0", root) == -1  # no such device
    assert pci_numa_node(None, root) == -1


@pytest.mark.parametrize(
    ("visible", "node"),
    [
        ("2", 1),  # Ray gave the actor GPU 2: on the second socket
        ("0", 0),
        ("GPU-3", 1),  # a UUID, as a scheduler may set CUDA_VISIBLE_DEVICES
        ("2,3", 1),  # a split cell on one socket
        ("1,2", 0),  # across the sockets, one GPU each: its first GPU's
        ("2,0,3", 1),  # most of its GPUs
        ("MIG-5c3d", -1),  # a MIG instance: not looked up
        ("7", -1),  # NVML knows no GPU 7
        ("", -1),  # no GPU at all
        (None, -1),
    ],
)
def test_a_cells_gpus_name_the_node_its_cores_should_sit_on(tmp_path, visible, node):
    assert visible_gpus_node(visible, node_with_four_gpus(), sysfs(tmp_path, BUSES)) == node


def test_without_nvml_no_node_is_known_and_nvml_is_left_as_it_was(tmp_path):
    root = sysfs(tmp_path, BUSES)
    assert visible_gpus_node("2", FakeNvml([], starts=False), root) == -1
    held = node_with_four_gpus()
    held.nvmlInit()  # the cell's NVML, started before it looks its GPUs up
    assert gpus_numa_nodes(["GPU-0", "GPU-2"], held, root) == [0, 1]
    assert held.held == 1 and held.inits == 1  # its own init shut down again, NVML not restarted


def test_the_nearest_node_is_the_majoritys_then_the_first_gpus():
    assert nearest_node([1, 0, 0]) == 0
    assert nearest_node([1, 0]) == 1
    assert nearest_node([-1, 1]) == 1  # an unknown node does not vote
    assert nearest_node([-1, -1]) == -1
    assert nearest_node([]) == -1


def test_the_cells_gpus_are_read_back_from_its_environment():
    assert recorded_gpu_uuids({"gpu_uuid": "GPU-a", "gpu_uuids": "GPU-a,GPU-b"}) == ("GPU-a", "GPU-b")
    assert recorded_gpu_uuids({"device_name": "cpu"}) == ()  # a CPU cell: no GPU to meter or probe
