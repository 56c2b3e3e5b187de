"""The exact (Clopper-Pearson) interval of a share of successes: how far a task accuracy can be trusted.

A cell answers a few dozen prompts at most, so a normal approximation would give intervals past 0
or 1 exactly where accuracy matters (a cache that gets everything right, or nothing). The exact
interval inverts the binomial distribution itself; it is found by bisection on the binomial tail,
which needs nothing beyond the standard library.
"""

import math

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
