"""The search along one axis: gallop from the planner's predicted boundary, then bisect (docs/capacity.md).

Values are whole steps (a batch size, or a context in units of `search.context_step`) from 1 to a ceiling. Each
probe past the prediction doubles the distance from it (1, 3, 7 ...) until the frontier is bracketed, then halves
the bracket. Probes never go above a known failure nor below a known pass: that assumes a failure at v means a
failure above v (memory does; an SLO nearly does). A reading's `aim` replaces the next doubling or middle, kept
inside the bracket; a failure without a reading (an OOM) drops it. With `halve_down`, a failed start is followed
by half of it: one pass and its aim is shorter than walking down from an overestimate without readings.

Pure and deterministic: the same outcomes and readings give the same probes, which is what lets an interrupted
search resume through the probes it already has.

Readings aim because memory and latency grow about linearly with batch and context. They make the search short,
never right: `Stepping` brackets and bisects without them.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kvsweep.capacity.frontier import Slo, upper_end
from kvsweep.names import Metric
from kvsweep.results import OK, CellResult


@dataclass
class Stepping:
    ceiling: int
    start: int  # the predicted boundary (clipped to 1..ceiling); 1 when nothing is predicted
    outcomes: dict[int, bool] = field(default_factory=dict)  # value -> passed
    stopped: bool = False  # a probe ended in neither pass nor a size-driven failure
    aim: int | None = None  # where the last probe's readings put the frontier (`capacity/search_steps.py`); None: none
    halve_down: bool = False  # passes will bring readings: below a failed start, halve instead of galloping

    def __post_init__(self) -> None:
        self.start = min(max(self.start, 1), self.ceiling)

    @property
    def best(self) -> int:
        """The largest value known to pass below every known failure (0: none passed)."""
        return max((v for v, ok in self.outcomes.items() if ok and v < self.lowest_failure), default=0)

    @property
    def lowest_failure(self) -> int:
        return min((v for v, ok in self.outcomes.items() if not ok), default=self.ceiling + 1)

    @property
    def done(self) -> bool:
        return self.stopped or self.lowest_failure == self.best + 1 or self.best == self.ceiling

    def record(self, value: int, passed: bool, aim: int | None = None) -> None:
        """An outcome, and where its readings put the frontier (an aim lasts until the next outcome)."""
        self.outcomes[value] = passed
        self.aim = aim

    def next_value(self) -> int | None:
        """The next value to probe, or None when the frontier is found (or stopped)."""
        if self.done:
            return None
        if not self.outcomes:
            return self.start
        low, high = self.best, self.lowest_failure
        if self.aim is not None and low > 0:  # a reading's estimate, kept inside the bracket
            aimed = min(max(self.aim, low + 1), min(high, self.ceiling + 1) - 1)
            if aimed not in self.outcomes:
                return aimed
        if high > self.ceiling:  # nothing failed yet: gallop up from the start
            ups = sum(1 for v in self.outcomes if v > self.start)
            return min(self.ceiling, max(low, self.start) + (1 << ups))
        if low == 0 and self.halve_down:  # one pass, and its reading aims at the frontier
            return max(1, high // 2)
        if low == 0:  # nothing passed yet: gallop down from the start
            downs = sum(1 for v in self.outcomes if v < self.start)
            return max(1, min(high, self.start) - (1 << downs))
        return (low + high) // 2


def start_of(predicted: int | None, step: int) -> int:
    """Where a search starts, in steps: at the predicted boundary, else at the smallest value."""
    return max(predicted // step, 1) if predicted else 1


def crossing(points: dict[int, float], target: float, slope_hint: float | None = None) -> int | None:
    """The largest value whose reading, on the line through the points nearest `target`, stays at or under it.

    Two points, one on each side of the target, are preferred; else the two largest under it; else one
    point and `slope_hint`. None when no line can be drawn or it does not rise."""
    under = sorted(v for v, r in points.items() if r <= target)
    over = sorted(v for v, r in points.items() if r > target)
    if under and over and over[0] > under[-1]:
        pair = (under[-1], over[0])
    elif len(under) >= 2:
        pair = (under[-2], under[-1])
    elif under and slope_hint:
        v = under[-1]
        return v + math.floor((target - points[v]) / slope_hint) if slope_hint > 0 else None
    else:
        return None
    (a, b), (ra, rb) = pair, (points[pair[0]], points[pair[1]])
    if rb <= ra:
        return None
    slope = (rb - ra) / (b - a)
    return a + math.floor((target - ra) / slope)


def aim(
    probes: dict[int, CellResult],
    slo: Slo,
    budget: int | None,
    planned_slope: Callable[[int], float | None],
) -> int | None:
    """Where the probes' readings put the frontier (`probes` by value in steps): the nearest of the memory's
    and each SLO's. `planned_slope(v)`: the planner's bytes per step at v, for a line through one reading."""
    aims = []
    memory = Metric.PEAK_DEVICE_MEM_BYTES
    fitted = {v: r.metrics[memory] for v, r in probes.items() if r.status == OK and memory in r.metrics}
    if budget is not None and fitted:
        aims.append(crossing(fitted, budget, planned_slope(max(fitted))))
    for bound, metric in ((slo.tpot_ms, Metric.TPOT_MS), (slo.ttft_ms, Metric.TTFT_MS)):
        readings = {v: upper_end(r, metric) for v, r in probes.items() if r.status == OK}
        readings = {v: value for v, value in readings.items() if value is not None}
        if bound and readings:
            aims.append(crossing(readings, bound))
    found = [a for a in aims if a is not None]
    return min(found) if found else None
