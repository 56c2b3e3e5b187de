"""Graphs compiled and CUDA graphs recorded in this process: a compiled cell's measured calls must add none.

A recompilation (Dynamo compiling a new graph) or a CUDA graph re-capture inside the measured phase
puts seconds of compiler work into a TPOT that claims to be steady state; warmup cannot absorb one
that happens on every call. Both are read from torch's own bookkeeping: Dynamo's `unique_graphs`
counter and the nodes of Inductor's CUDA graph trees (each node is one recording).

The opposite failure records nothing: Inductor may decide not to use CUDA graphs for a graph at all
(an input it cannot keep at a static address, a mutated input, too many re-recordings); it logs a
warning and adds one to its `cudagraph_skips` counter, which `cudagraph_skips` reads.
"""

from collections.abc import Mapping
from typing import Any


def compile_events() -> int:
    """Graphs compiled plus CUDA graphs recorded so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]) + cudagraphs_recorded()


def cudagraphs_recorded() -> int:
    """Recordings held by Inductor's CUDA graph trees on every device (0 where none were made)."""
    try:
        import torch
        from torch._inductor import cudagraph_trees as trees

        if not torch._C._is_key_in_tls("tree_manager_containers"):
            return 0
        containers: dict[int, Any] = trees.get_obj(trees.local, "tree_manager_containers")
    except Exception:  # another torch's internals: no recordings can be counted
        return 0
    total = 0
    for container in list(containers.values()):
        manager = getattr(container, "tree_manager", None)
        if manager is not None and manager.roots is not None:
            total += sum(_nodes(node) for nodes in manager.roots.values() for node in nodes)
    return total


def _nodes(node: Any) -> int:
    return 1 + sum(_nodes(child) for children in node.children.values() for child in children)


def cudagraph_skips(counters: Mapping[str, Mapping[str, int]] | None = None) -> int:
    """Graphs Inductor chose to run without CUDA graphs so far in this process.

    `counters`: torch's counters (`torch._dynamo.utils.counters` when None), by group then name.
    """
    if counters is None:
        from torch._dynamo.utils import counters as torch_counters

        counters = torch_counters
    return int(counters.get("inductor", {}).get("cudagraph_skips", 0))
