"""What each cell's actor reserves from Ray: its CPUs (auto for GPU cells) and whether spares wait for it.

Apart from the scheduler: pure arithmetic on the cluster's node resources, tested without a cluster.
"""

from collections.abc import Sequence
from dataclasses import replace

from kvsweep.driver.ray_session import CellNeeds


def spares_wanted(prestart: int, needs: CellNeeds) -> int:
    """Spare actors to keep ready: `ray.prestart` for CPU cells, none for cells that hold GPUs (a spare
    would wait for, or hold idle, a GPU; see the module docstring)."""
    return 0 if needs.gpus > 0 else prestart


GPU_CELL_MAX_CPUS = 8


def auto_cpus_per_cell(needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> int:
    """`ray.cpus_per_cell=0` (auto): the CPUs Ray reserves for one cell, so its threads can follow them.

    A CPU cell: 1, as always (it computes on every core it may use and cells run one at a time; see
    `cell/threads.py`). A GPU cell: its share of a node's CPUs, the node's CPUs per GPU times the GPUs
    it holds, so that the node's concurrent cells together use its cores once, not once each; taken on
    the node that offers the fewest (every node can then fill all its GPUs), at most
    `GPU_CELL_MAX_CPUS` (a GPU cell's CPU work is mostly one thread launching kernels), at least 1.
    Nodes that cannot hold a cell (too few GPUs, another accelerator type, a custom resource missing)
    do not count.
    """
    if needs.gpus <= 0:
        return 1
    wanted = {k: v for k, v in needs.as_resources().items() if k != "CPU"}
    shares = [
        int(node.get("CPU", 0.0) * needs.gpus // node["GPU"])
        for node in nodes
        if all(node.get(k, 0.0) >= v for k, v in wanted.items())
    ]
    return max(1, min(GPU_CELL_MAX_CPUS, min((s for s in shares if s >= 1), default=1)))


def with_cpus_resolved(needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> CellNeeds:
    """`needs` with an auto CPU count (0) replaced by `auto_cpus_per_cell`; an explicit count as it is."""
    return needs if needs.cpus > 0 else replace(needs, cpus=auto_cpus_per_cell(needs, nodes))
