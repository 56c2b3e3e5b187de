"""What each cell's actor reserves from Ray: its CPUs (auto for GPU cells), host memory for an offloaded
cache's pinned blocks, and whether spares wait for it.

Apart from the scheduler: pure arithmetic on the cluster's node resources, tested without a cluster.
"""

from collections.abc import Sequence
from dataclasses import replace

from kvsweep.driver.ray_session import CellNeeds, can_hold


def spares_wanted(prestart: int, needs: CellNeeds) -> int:
    """Spare actors to keep ready: `ray.prestart` for CPU cells, none for cells that hold GPUs (a spare
    would wait for, or hold idle, a GPU; see the module docstring)."""
    return 0 if needs.gpus > 0 else prestart


GPU_CELL_MAX_CPUS = 8
NODE_CPUS_KEPT = 1  # per node, for Ray's daemons (raylet, GCS), the driver, MLflow and the template


def auto_cpus_per_cell(needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> int:
    """`ray.cpus_per_cell=0` (auto): the CPUs Ray reserves for one cell, so its threads can follow them.

    A CPU cell: 1, as always (it computes on every core it may use and cells run one at a time; see
    `cell/process.py`). A GPU cell: its share of a node's CPUs less `NODE_CPUS_KEPT`, (CPUs - 1) x the
    GPUs it holds // the node's GPUs, so that the node's concurrent cells together use its cores once,
    not once each, and leave one core to the processes every node runs besides its cells (each CUDA
    cell is pinned to cores of its own, `cell/cpu_slots.py`: were all cores lent, those processes would
    run on some cell's cores and that cell would read them as contention). 16 CPUs and 8 GPUs: 1 each,
    8 cores lent. Taken on the node that offers the fewest (every node can then fill all its GPUs), at
    most `GPU_CELL_MAX_CPUS` (a GPU cell's CPU work is mostly one thread launching kernels), at least 1.
    Nodes that cannot hold a cell (too few GPUs, another accelerator type, a custom resource missing)
    do not count.
    """
    if needs.gpus <= 0:
        return 1
    wanted = {k: v for k, v in needs.as_resources().items() if k != "CPU"}
    shares = [
        int(max(0.0, node.get("CPU", 0.0) - NODE_CPUS_KEPT) * needs.gpus // node["GPU"])
        for node in nodes
        if can_hold(node, wanted)
    ]
    return max(1, min(GPU_CELL_MAX_CPUS, min((s for s in shares if s >= 1), default=1)))


def with_cpus_resolved(needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> CellNeeds:
    """`needs` with an auto CPU count (0) replaced by `auto_cpus_per_cell`; an explicit count as it is."""
    return needs if needs.cpus > 0 else replace(needs, cpus=auto_cpus_per_cell(needs, nodes))


def memory_ask(host_bytes: int, needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> int:
    """Bytes of Ray's `memory` resource a cell's actor reserves: the pinned host memory its offloaded
    cache is predicted to hold (`plan/offload.py`), so that Ray puts side by side on a node only the
    offloaded cells whose pinned blocks fit its memory (a node's `memory` is what it had free when Ray
    started there, less its object store), and holds the next one back until one of them ends.

    At most the most that any node able to hold the cell offers: Ray would keep an actor that asks for
    more pending forever; asking for all of a node's memory, the cell runs there with no other
    offloaded cell beside it. (Blocks larger than the host's memory outright are planned as
    `predicted host oom` and never get here.) 0: no ask (no offloading, or no node reports memory).
    """
    if host_bytes <= 0:
        return 0
    wanted = needs.as_resources()
    offered = max((node.get("memory", 0.0) for node in nodes if can_hold(node, wanted)), default=0.0)
    return int(min(host_bytes, offered))
