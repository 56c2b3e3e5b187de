"""The 95% interval of a median, checked against the true median of known distributions."""

import math
import random
from statistics import NormalDist

import pytest

from kvsweep.measure.statistics import median_interval, precise_enough


@pytest.mark.parametrize("n", [6, 10, 31, 100])
def test_the_interval_covers_the_true_median_at_least_95_percent_of_the_time(n):
    rng = random.Random(n)
    true_median = math.exp(1.0)  # lognormal(mu=1, sigma=0.5): skewed, like timings
    trials = 3000
    covered = 0
    for _ in range(trials):
        interval = median_interval([rng.lognormvariate(1.0, 0.5) for _ in range(n)])
        covered += interval.low <= true_median <= interval.high
    assert interval.coverage >= 0.95
    # Exact coverage is known; the simulated share must agree within sampling error (3 sigma).
    sigma = math.sqrt(interval.coverage * (1 - interval.coverage) / trials)
    assert covered / trials == pytest.approx(interval.coverage, abs=3 * sigma + 1e-3)


# Half of all calls lie below the median: 0.5 / 0.7 of the fast mode (the slow mode is far above).
TRUE_BIMODAL_MEDIAN = NormalDist(10, 0.5).inv_cdf(0.5 / 0.7)


def test_a_bimodal_distribution_is_covered_too():
    rng = random.Random(0)
    covered = 0
    for _ in range(2000):
        # 70% fast calls near 10 ms, 30% slow near 30 ms: the true median is in the fast mode (10 ms).
        samples = [rng.gauss(10, 0.5) if rng.random() < 0.7 else rng.gauss(30, 1) for _ in range(20)]
        interval = median_interval(samples)
        covered += interval.low <= TRUE_BIMODAL_MEDIAN <= interval.high
    assert covered / 2000 >= 0.94


def test_below_six_samples_the_interval_is_the_range_and_says_its_lower_coverage():
    interval = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (interval.low, interval.high) == (1.0, 5.0)
    assert interval.coverage == pytest.approx(1 - 2 / 2**5)


def test_precision_needs_a_true_95_percent_interval_within_the_target():
    steady = [100.0 + 0.1 * (i % 3) for i in range(12)]
    noisy = [100.0 * (1 + 0.5 * (i % 2)) for i in range(12)]
    assert precise_enough([steady], 0.01)
    assert not precise_enough([noisy], 0.01)
    assert not precise_enough([steady[:5]], 0.01)  # five samples give no 95% interval
