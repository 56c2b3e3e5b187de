"""OOM inference: a cell that ran out of memory implies the same for larger cells of its family.

Family = model, dtype, cache, compile. A cell at least as large on every size axis (batch, context,
new tokens) as a cell that ran out of memory is recorded as `oom` with `kvsweep.inferred=true`
instead of being run. Jobs are ordered small to large so this can work.
"""

from kvsweep.driver.scheduler import Job
from kvsweep.grid import Cell
from kvsweep.names import ResultTag
from kvsweep.results import OOM, CellResult

SIZE_AXES = ("batch_size", "context_length", "max_new_tokens")
FAMILY = ("model", "dtype", "cache", "compile")


def size_order(job: Job) -> tuple[int, int]:
    cell = job.cell
    return (cell.batch_size * (cell.context_length + cell.max_new_tokens), cell.batch_size)


class OomPruner:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.out_of_memory: list[tuple[Cell, str]] = []  # (cell, oom kind)

    def observe(self, result: CellResult) -> None:
        if result.status == OOM and result.tags.get(ResultTag.INFERRED) != "true":
            self.out_of_memory.append((result.cell, result.tags.get(ResultTag.OOM_KIND, "device")))

    def admit(self, job: Job) -> CellResult | None:
        """None: run it. A result: it is known to run out of memory."""
        if not self.enabled:
            return None
        for smaller, kind in self.out_of_memory:
            same_family = all(getattr(job.cell, k) == getattr(smaller, k) for k in FAMILY)
            if same_family and all(getattr(job.cell, k) >= getattr(smaller, k) for k in SIZE_AXES):
                cause = f"ctx={smaller.context_length} bs={smaller.batch_size} new={smaller.max_new_tokens}"
                return CellResult(
                    job.cell_id,
                    job.cell,
                    OOM,
                    error=f"inferred: the smaller cell {cause} already ran out of memory",
                    tags={ResultTag.INFERRED: "true", ResultTag.OOM_KIND: kind},
                )
        return None
