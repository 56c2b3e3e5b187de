"""How sure is a median? A distribution-free 95% confidence interval from the order statistics.

For n independent samples, the number below the true median is Binomial(n, 1/2), so the interval
between the j-th smallest and the j-th largest sample covers the median with probability
P(j <= B <= n - j). The widest j whose coverage is still >= 95% gives the interval. It assumes
nothing about the shape of the timing distribution (which is skewed and often bimodal), unlike a
normal-theory interval, and unlike a bootstrap it is exact and deterministic. Below 6 samples no
pair reaches 95% (n=5 gives 93.8%): the interval is then the sample range and `coverage` says so.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvsweep.measure.stats import median
from kvsweep.names import ci_high, ci_low

CONFIDENCE = 0.95


@dataclass(frozen=True)
class MedianInterval:
    """The order-statistic interval of a median and how surely it covers it."""

    low: float
    high: float
    coverage: float  # the interval's exact coverage probability (>= CONFIDENCE when n >= 6)

    def rel_half_width(self, centre: float) -> float:
        """Half the interval's width as a share of the median: the precision `measure.target_rel_ci` asks for."""
        return (self.high - self.low) / 2 / abs(centre) if centre else math.inf


def _coverage(n: int, j: int) -> float:
    """P(X(j) <= median <= X(n-j+1)) = P(j <= B <= n-j) for B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2**n


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> MedianInterval:
    """The order-statistic interval of the median; NaN bounds for no samples."""
    n = len(values)
    if n == 0:
        return MedianInterval(math.nan, math.nan, 0.0)
    ordered = sorted(values)
    j = 1
    while j + 1 <= n - j and _coverage(n, j + 1) >= confidence:
        j += 1
    return MedianInterval(ordered[j - 1], ordered[n - j], _coverage(n, j) if n > 1 else 0.0)


def interval_metrics(name: str, values: Sequence[float]) -> dict[str, float]:
    """`<name>_ci_low` / `<name>_ci_high` for a metric whose value is the median of `values`."""
    interval = median_interval(values)
    return {ci_low(name): interval.low, ci_high(name): interval.high}


def precise_enough(samples: Sequence[Sequence[float]], target: float) -> bool:
    """Every series' interval is a true 95% one and no wider than +-target of its median."""
    for values in samples:
        interval = median_interval(values)
        if interval.coverage < CONFIDENCE or interval.rel_half_width(median(values)) > target:
            return False
    return True
