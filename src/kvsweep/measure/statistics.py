"""The statistics kvsweep reports with (standard library only: the driver needs no numpy).

- A median's 95% interval is distribution-free: for n independent samples the count below the true median is
  Binomial(n, 1/2), so the j-th smallest to j-th largest covers it with probability P(j <= B <= n - j). It assumes
  nothing of the (skewed, often bimodal) timings and, unlike a bootstrap, is exact and deterministic. Below 6
  samples no pair reaches 95%: the interval is the range and `coverage` says so.
- A task accuracy's interval is exact (Clopper-Pearson, by bisection on the binomial tail): at a few dozen prompts
  a normal approximation would give intervals past 0 or 1 exactly where accuracy matters.
- Strategies differ only where their intervals do not overlap; a cost against dynamic adds both medians' relative
  half-widths in quadrature (first-order error propagation for a ratio, symmetric like the `+-` it prints as).
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


BISECTION_STEPS = 60  # halves the bracket to below 1e-18: far beyond what a share is read to


def binomial_cdf(successes: int, trials: int, p: float) -> float:
    """P(X <= successes) for X ~ Binomial(trials, p), summed term by term in log space."""
    if successes < 0:
        return 0.0
    if successes >= trials or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for k in range(successes + 1):
        log_choose = math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
        total += math.exp(log_choose + k * log_p + (trials - k) * log_q)
    return min(total, 1.0)


def _solve(decreasing, target: float) -> float:
    """The p in [0, 1] where the decreasing function `decreasing(p)` crosses `target`."""
    low, high = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if decreasing(middle) > target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def exact_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson interval: the shares p whose binomial tails leave `successes` plausible."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    tail = (1 - confidence) / 2
    # The lowest p under which seeing `successes` or more is still as likely as `tail`...
    low = 0.0 if successes == 0 else _solve(lambda p: binomial_cdf(successes - 1, trials, p), 1 - tail)
    # ...and the highest p under which seeing `successes` or fewer is.
    high = 1.0 if successes == trials else _solve(lambda p: binomial_cdf(successes, trials, p), tail)
    return low, high


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


def fewest_for_interval(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest independent values whose range brackets the q-th percentile (0 < q < 100) with `confidence`:
    the smallest n with 1 - p^n - (1-p)^n >= confidence (6 for a median, 29 for a p90, 299 for a p99)."""
    p = q / 100.0
    if not 0 < p < 1:
        raise ValueError(f"a percentile with an interval is strictly between 0 and 100, got {q}")
    n = 2
    while 1 - p**n - (1 - p) ** n < confidence:
        n += 1
    return n
