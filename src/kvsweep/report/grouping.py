"""How the selection groups cells, what a group ranks them by, and which dynamic cell judges a workload group.

A group is the cells that differ only in their cache strategy: a fixed shape (model, dtype, B, context, new
tokens, weights) or a workload's mix served one way (model, dtype, B, weights, mix, serving mode).

Continuous serving runs only `paged`, so its groups never hold a dynamic cell. The mix's dynamic cell served the
very same requests otherwise (one at a time, or in static batches), and greedy answers do not depend on how
requests were served, so its answers are the quality gate's reference there; its timings are not compared.
"""

from kvsweep.caches import BASELINE
from kvsweep.grid import strategy_label
from kvsweep.results import OK, CellResult

# model, dtype, batch size, context length, new tokens, weights, workload, serving ("" "" for a fixed shape), and the
# offered rate (requests/s; 0: a closed loop or a trace's own times): cells at two load levels are never compared
GroupKey = tuple[str, str, int, int, int, str, str, str, float]
SEQUENTIAL = "sequential"


def group_key(result: CellResult) -> GroupKey:
    c = result.cell
    shape = (int(c.batch_size), int(c.context_length), int(c.max_new_tokens))
    return (str(c.model), str(c.dtype), *shape, c.weights, c.workload, c.serving, float(c.rate))


def mix_of(key: GroupKey) -> tuple | None:
    """A group's mix (model, dtype, weights, workload), whatever its serving mode and B; None for a fixed shape."""
    return (key[0], key[1], key[5], key[6]) if key[6] else None


def mix_references(results: list[CellResult]) -> dict[tuple, CellResult]:
    """Each mix's dynamic cell (eager, ok; sequential first, then the smallest B)."""
    found: dict[tuple, CellResult] = {}
    for result in sorted(results, key=lambda r: (r.cell.serving != SEQUENTIAL, r.cell.batch_size)):
        c = result.cell
        if c.workload and strategy_label(c) == BASELINE and result.status == OK:
            found.setdefault((c.model, c.dtype, c.weights, c.workload), result)
    return found
