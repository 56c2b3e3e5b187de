"""What a cell's intervals allow the report to say: is A faster than B, and how sure is "-12%"?

Cells carry a 95% interval of each timing median (`<metric>_ci_low/high`). Two strategies are told
apart only when their intervals do not overlap; a cost against dynamic carries the ratio's
uncertainty, the relative half-widths of both medians added in quadrature (first-order error
propagation for a ratio; it is symmetric, like the `+-` it is printed as).
"""

import math
from collections.abc import Mapping

from kvsweep.names import ci_high, ci_low

CiBounds = tuple[float, float]  # (low, high) of a metric's 95% interval, as its result logs them


def metric_interval(metrics: Mapping[str, float], name: str) -> CiBounds | None:
    """The metric's interval; a point when the cell has none (runs from before intervals were logged)."""
    if name not in metrics:
        return None
    low, high = metrics.get(ci_low(name)), metrics.get(ci_high(name))
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return metrics[name], metrics[name]
    return low, high


def overlaps(a: CiBounds | None, b: CiBounds | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _rel_half_width(metrics: Mapping[str, float], name: str) -> float | None:
    low, high, centre = metrics.get(ci_low(name)), metrics.get(ci_high(name)), metrics.get(name)
    if low is None or high is None or not centre or math.isnan(low) or math.isnan(high):
        return None
    return (high - low) / 2 / abs(centre)


def ratio_error(mine: Mapping[str, float], theirs: Mapping[str, float], name: str) -> float | None:
    """+- on `mine/theirs - 1` for a timing metric, from both cells' intervals; None without them."""
    a, b = _rel_half_width(mine, name), _rel_half_width(theirs, name)
    if a is None or b is None or not theirs.get(name):
        return None
    return mine[name] / theirs[name] * math.hypot(a, b)
