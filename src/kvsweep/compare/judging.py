"""What `compare` compares, per metric: which way is worse, the interval it carries, its verdict words.

The metric kinds, their intervals and the verdicts are tabled in docs/compare.md. A change is called only when the
two 95% intervals do not overlap (sampling noise cannot explain it) and B/A moved by more than the threshold in
either direction: the allowance for the drift between two processes minutes apart (the host's load and clock, its
neighbours, the allocator's luck), which no run's interval covers. Timings drift far more than memory peaks or
quality readings, so each kind has its own allowance (defaults from repeated identical sweeps, BENCHMARKS.md,
"Compare"); a repeat of sweep A gives measured ones instead, never below the floors the user gave.
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvsweep.inputs.tasks.suite import TASKS
from kvsweep.measure.statistics import metric_interval
from kvsweep.names import Metric, ResultTag, task_accuracy_metric
from kvsweep.results import OK, CellResult

TIMING, MEMORY, EXACT, QUALITY = "timing", "memory", "exact", "quality"

Interval = tuple[float, float]


@dataclass(frozen=True)
class Compared:
    """One metric as `compare` judges it."""

    name: str
    kind: str  # timing | memory | exact | quality
    higher_is_worse: bool
    interval_of: str = ""  # the metric whose 95% interval this one carries ("" = a single reading)
    floor: float = 0.0  # an absolute change at most this large is within noise (shares, nats)
    unit: str = ""

    @property
    def words(self) -> tuple[str, str]:
        """(worse, better) in this metric's terms."""
        return {TIMING: ("slower", "faster"), MEMORY: ("larger", "smaller"), EXACT: ("larger", "smaller")}.get(
            self.kind, ("worse", "better")
        )


COMPARED = (
    Compared(Metric.TTFT_MS, TIMING, True, Metric.TTFT_MS, unit="ms"),
    Compared(Metric.TPOT_MS, TIMING, True, Metric.TPOT_MS, unit="ms"),
    Compared(Metric.E2E_MS, TIMING, True, Metric.E2E_MS, unit="ms"),
    Compared(Metric.DECODE_TOKENS_PER_S, TIMING, False, Metric.TPOT_MS, unit="tok/s"),
    Compared(Metric.PEAK_DEVICE_MEM_BYTES, MEMORY, True, unit="B"),
    Compared(Metric.PEAK_HOST_RSS_BYTES, MEMORY, True, unit="B"),
    Compared(Metric.KV_CACHE_BYTES, EXACT, True, unit="B"),
    Compared(Metric.TOKEN_AGREEMENT, QUALITY, False, floor=0.01),
    Compared(Metric.PASSKEY_ACCURACY, QUALITY, False, Metric.PASSKEY_ACCURACY),
    Compared(Metric.ANSWER_ACCURACY, QUALITY, False, Metric.ANSWER_ACCURACY),
    *(  # each task of the suite (passkey's is above)
        Compared(task_accuracy_metric(task), QUALITY, False, task_accuracy_metric(task))
        for task in TASKS
        if task_accuracy_metric(task) != Metric.PASSKEY_ACCURACY
    ),
    Compared(Metric.KL_DIVERGENCE, QUALITY, True, floor=0.01, unit="nats"),
)
BY_NAME = {c.name: c for c in COMPARED}


def value(metrics: Mapping[str, float], compared: Compared) -> float | None:
    found = metrics.get(compared.name)
    return None if found is None or math.isnan(found) else float(found)


def interval(metrics: Mapping[str, float], compared: Compared) -> Interval | None:
    """The metric's 95% interval; a point when it carries none. A rate borrows its time's interval
    inverted (tokens/s = k / TPOT, so its low end is at TPOT's high end)."""
    centre = value(metrics, compared)
    if centre is None:
        return None
    source = compared.interval_of
    found = metric_interval(metrics, source) if source else None  # the report's reading: a point without one
    if found is None:
        return centre, centre
    low, high = found
    if source == compared.name:
        return float(low), float(high)
    own = metrics.get(source)
    if not own or low <= 0 or low == high:
        return centre, centre
    return centre * own / high, centre * own / low


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


SLOWER, FASTER, LARGER, SMALLER, WORSE, BETTER = "slower", "faster", "larger", "smaller", "worse", "better"
WITHIN_NOISE, SAME, CONTENDED = "within noise", "same", "contended"
STATUS_CHANGED, ADDED, REMOVED = "status changed", "added", "removed"
REGRESSIONS = frozenset({SLOWER, LARGER, WORSE})
IMPROVEMENTS = frozenset({FASTER, SMALLER, BETTER})


@dataclass(frozen=True)
class Judged:
    ratio: float  # B / A
    ratio_low: float  # B/A when both sides sit at the ends of their intervals that bring them closest...
    ratio_high: float  # ...and farthest: the ratio's range given both intervals
    verdict: str


def ratio(a: float, b: float) -> float:
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


def ratio_interval(a: Interval, b: Interval) -> Interval:
    """B/A's range when each side may lie anywhere in its interval: [B low / A high, B high / A low]."""
    low = b[0] / a[1] if a[1] > 0 else math.nan
    high = b[1] / a[0] if a[0] > 0 else math.inf
    return low, high


def change(r: float) -> float:
    """How far B/A is from 1, the same either way: 1.25 and 0.8 are both a change of 0.25."""
    if r <= 0 or math.isinf(r):
        return math.inf
    return max(r, 1 / r) - 1


def judge(compared: Compared, a: Interval, b: Interval, centres: Interval, threshold: float, contended: bool) -> Judged:
    """`a`, `b`: each side's interval; `centres`: (A, B), the medians or readings themselves."""
    va, vb = centres
    r = ratio(va, vb)
    low, high = ratio_interval(a, b)
    worse, better = compared.words
    if contended and compared.kind == TIMING:
        verdict = CONTENDED
    elif compared.kind == EXACT:
        verdict = SAME if va == vb else (worse if (vb > va) == compared.higher_is_worse else better)
    else:
        apart = b[0] > a[1] or b[1] < a[0]
        if apart and change(r) > threshold and abs(vb - va) > compared.floor:
            verdict = worse if (vb > va) == compared.higher_is_worse else better
        else:
            verdict = WITHIN_NOISE
    return Judged(r, low, high, verdict)
