"""The verdict on one metric of one cell measured by both sweeps, and what counts as a regression.

A change is called only when both hold: the two 95% intervals do not overlap (the sweeps' own
sampling noise cannot explain it), and B/A moved by more than the threshold in either direction
(max(B/A, A/B) - 1 > threshold) — the allowance for the drift between two runs, which no single
run's interval covers. Anything less is `within noise`. Exact quantities (KV cache bytes) are
`same` or changed, with no allowance. A timing measured under contention on either side gets no
verdict (`contended`).
"""

import math
from dataclasses import dataclass

from kvsweep.compare.metrics import EXACT, TIMING, Compared, Interval

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
