"""How large a change must be before `compare` calls it: defaults chosen from data, or a sweep's own drift.

A run's 95% interval covers its sampling noise, not the drift between two processes minutes apart
(the host's load and clock, its neighbours, the allocator's luck). Timings drift far more than
memory peaks or quality readings, so each kind has its own allowance; both defaults were chosen from
repeated identical quickstart sweeps on a shared 2-core VM (BENCHMARKS.md, "Compare"): timings
drifted by up to 46% there (TTFT; TPOT 27%), memory peaks by under 2%; each default is the worst drift
rounded up to the next tenth, plus a tenth. A user with a repeat of sweep A (the same
sweep run again, nothing changed) gets a measured allowance instead: per metric, the largest change
any cell showed between A and its repeat (never below the floors the user gave).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsweep.compare.metrics import BY_NAME, COMPARED, EXACT, TIMING, value
from kvsweep.compare.verdict import change, ratio
from kvsweep.names import ResultTag
from kvsweep.results import OK, CellResult

DEFAULT_THRESHOLD = 0.6  # timings: identical quickstart sweeps drifted by up to 46% here; next tenth + 0.1
DEFAULT_MEMORY_THRESHOLD = 0.05  # memory peaks and quality readings: they drifted under 2%


@dataclass(frozen=True)
class Thresholds:
    timing: float = DEFAULT_THRESHOLD
    memory: float = DEFAULT_MEMORY_THRESHOLD  # memory peaks and quality readings
    by_metric: dict[str, float] = field(default_factory=dict)  # drift measured between A and its repeat
    baseline: str = ""  # the repeat's parent run id, when there is one
    baseline_cells: int = 0  # cells the repeat and A both measured cleanly

    def of(self, metric: str) -> float:
        """The allowance for one metric: the repeat's drift where it measured one, never below this kind's
        threshold (with a baseline, the floors the user gave, 0 by default)."""
        kind = self.timing if metric in BY_NAME and BY_NAME[metric].kind == TIMING else self.memory
        return max(kind, self.by_metric.get(metric, 0.0))


def clean(result: CellResult) -> bool:
    """Ran, and not under contention: its timings mean what they say."""
    return result.status == OK and result.tags.get(ResultTag.CONTENDED) != "true"


def drift_thresholds(
    a: Iterable[CellResult], repeat: Iterable[CellResult], floors: Thresholds, baseline: str
) -> Thresholds:
    """Per metric, the largest change between A's cells and the same cells of a repeat of A; `floors`
    keeps each kind's allowance from falling below what the user asked for."""
    mine = {r.cell: r for r in a if clean(r)}
    pairs = [(mine[r.cell], r) for r in repeat if clean(r) and r.cell in mine]
    drift: dict[str, float] = {}
    for compared in COMPARED:
        if compared.kind == EXACT:
            continue
        changes = [
            change(ratio(va, vb))
            for x, y in pairs
            if (va := value(x.metrics, compared)) is not None and (vb := value(y.metrics, compared)) is not None
        ]
        if changes:
            drift[compared.name] = max(changes)
    return Thresholds(floors.timing, floors.memory, drift, baseline, len(pairs))
