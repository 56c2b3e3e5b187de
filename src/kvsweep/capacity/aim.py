"""Where a probe's readings put the frontier: memory and latency grow about linearly with batch and context.

The search needs no readings to be right (`stepping.py` brackets and bisects); they make it short. A
passing probe's peak device memory and the memory it may use give the last size that still fits, along
a line through the two largest passing probes' readings (or, with one, the planner's bytes per step). A
latency SLO is crossed where the line through the readings nearest the SLO reaches it: between a probe
that met it and one that did not (regula falsi), or past the two largest that met it.
"""

import math
from collections.abc import Callable

from kvsweep.capacity.verdict import Slo, upper_end
from kvsweep.names import Metric
from kvsweep.results import OK, CellResult


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
