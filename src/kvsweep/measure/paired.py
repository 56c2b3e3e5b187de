"""Comparisons of two caches measured on the very same requests or trials: paired tests (standard library only).

Every cache of a workload replays the same requests, and every quality cell answers the same trials, so a
comparison is made on the pairs, not on two independent summaries. Pairing removes what the requests themselves
vary by (a 4k prompt is slow for every cache) and leaves what the caches differ by.

- Latency: the median of the per-request ratios mine / reference, with the distribution-free interval of a median
  (the j-th smallest to j-th largest ratio, `statistics.median_interval`). That interval is the sign test
  inverted: the ratios it excludes are those a two-sided sign test rejects at 5%. It assumes the pairs are
  independent draws; under open-loop arrivals neighbouring requests share queueing, which makes it narrower than
  it should be there (docs/measurement.md).
- Task accuracy: McNemar's exact test on the discordant trials (reference right and mine wrong, or the reverse):
  under no difference their split is Binomial(m, 1/2). The interval of the accuracy difference is exact conditional
  on the m discordant trials, the test's own conditioning: (m / n) x (2 theta - 1), theta's Clopper-Pearson
  interval; with none discordant it is +-(Clopper-Pearson upper bound of 0 discordant in n).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvsweep.measure.statistics import CONFIDENCE, binomial_cdf, exact_interval, median, median_interval

FASTER, SLOWER, TIED = "faster", "slower", "tied"


@dataclass(frozen=True)
class PairedRatio:
    """The median per-pair ratio mine / reference and its 95% interval over `pairs` pairs."""

    ratio: float
    low: float
    high: float
    pairs: int
    coverage: float  # the interval's exact coverage (below CONFIDENCE for fewer than 6 pairs)

    @property
    def verdict(self) -> str:
        """faster or slower when the interval excludes 1 (a true 95% interval), tied otherwise."""
        if self.coverage < CONFIDENCE:
            return TIED
        if self.high < 1.0:
            return FASTER
        if self.low > 1.0:
            return SLOWER
        return TIED

    def change(self) -> str:
        """'+12% [+8%, +15%]': the median ratio and its interval as changes."""
        return f"{self.ratio - 1:+.0%} [{self.low - 1:+.0%}, {self.high - 1:+.0%}]"

    def text(self) -> str:
        """'+12% [+8%, +15%] paired over 32 requests'."""
        return f"{self.change()} paired over {self.pairs} requests"


def paired_ratio(mine: Sequence[float | None], reference: Sequence[float | None]) -> PairedRatio | None:
    """The median of mine[i] / reference[i] over the pairs where both are positive numbers; None without a pair.
    The two series must be of the same requests, in the same order."""
    if len(mine) != len(reference):
        raise ValueError(f"paired series must be of the same requests: {len(mine)} against {len(reference)}")
    ratios = [a / b for a, b in zip(mine, reference, strict=True) if a is not None and b is not None and b > 0]
    ratios = [r for r in ratios if math.isfinite(r)]
    if not ratios:
        return None
    interval = median_interval(ratios)
    return PairedRatio(median(ratios), interval.low, interval.high, len(ratios), interval.coverage)


@dataclass(frozen=True)
class PairedAccuracy:
    """Two caches' answers to the same trials: the discordant counts, the accuracy difference (mine - reference)
    with its exact 95% interval, and McNemar's exact two-sided p-value."""

    trials: int
    lost: int  # the reference right, mine wrong
    gained: int  # mine right, the reference wrong
    difference: float
    low: float
    high: float
    p_value: float

    @property
    def drop(self) -> float:
        """How far below the reference mine is (positive: worse)."""
        return -self.difference

    def text(self) -> str:
        """'-0.31 [-0.52, -0.10], McNemar p=0.004 (lost 6, gained 1 of 16)'."""
        return (
            f"{self.difference:+.2f} [{self.low:+.2f}, {self.high:+.2f}], McNemar p={self.p_value:.3g} "
            f"(lost {self.lost}, gained {self.gained} of {self.trials})"
        )


def mcnemar_p_value(lost: int, gained: int) -> float:
    """Exact two-sided McNemar: twice the smaller binomial tail of the discordant split, at most 1."""
    discordant = lost + gained
    if discordant == 0:
        return 1.0
    return min(1.0, 2.0 * binomial_cdf(min(lost, gained), discordant, 0.5))


def paired_accuracy(mine: Sequence[bool], reference: Sequence[bool]) -> PairedAccuracy:
    """McNemar's exact test and the difference's interval for two caches' verdicts on the same trials."""
    if len(mine) != len(reference) or not mine:
        raise ValueError(f"paired trials must be the same, non-empty: {len(mine)} against {len(reference)}")
    n = len(mine)
    lost = sum(1 for a, b in zip(mine, reference, strict=True) if b and not a)
    gained = sum(1 for a, b in zip(mine, reference, strict=True) if a and not b)
    discordant = lost + gained
    difference = (gained - lost) / n
    if discordant == 0:
        bound = exact_interval(0, n, CONFIDENCE)[1]
        low, high = -bound, bound
    else:
        theta_low, theta_high = exact_interval(gained, discordant, CONFIDENCE)
        scale = discordant / n
        low, high = scale * (2 * theta_low - 1), scale * (2 * theta_high - 1)
    return PairedAccuracy(n, lost, gained, difference, low, high, mcnemar_p_value(lost, gained))
