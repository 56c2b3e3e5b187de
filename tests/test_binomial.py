"""The exact binomial interval of a task accuracy, against textbook Clopper-Pearson values."""

import math

import pytest

from kvsweep.measure.statistics import binomial_cdf, exact_interval

# Clopper-Pearson 95% intervals as tabulated (e.g. scipy.stats.binomtest(k, n).proportion_ci("exact")).
TEXTBOOK = [
    ((5, 10), (0.1871, 0.8129)),
    ((0, 10), (0.0, 0.3085)),
    ((10, 10), (0.6915, 1.0)),
    ((15, 16), (0.6977, 0.9984)),
    ((5, 16), (0.1102, 0.5866)),
    ((16, 16), (0.7941, 1.0)),
    ((1, 100), (0.0003, 0.0545)),
]


@pytest.mark.parametrize(("counts", "expected"), TEXTBOOK)
def test_intervals_match_the_tables(counts, expected):
    low, high = exact_interval(*counts)
    assert low == pytest.approx(expected[0], abs=1e-4) and high == pytest.approx(expected[1], abs=1e-4)


def test_the_cdf_is_the_sum_of_the_binomial_terms():
    n, p = 12, 0.3
    terms = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    for k in range(n + 1):
        assert binomial_cdf(k, n, p) == pytest.approx(sum(terms[: k + 1]), rel=1e-12)


def test_an_interval_contains_its_share_and_narrows_with_trials():
    for n in (4, 16, 64):
        for k in range(n + 1):
            low, high = exact_interval(k, n)
            assert low <= k / n <= high
    assert exact_interval(48, 64)[1] - exact_interval(48, 64)[0] < exact_interval(12, 16)[1] - exact_interval(12, 16)[0]


def test_impossible_counts_are_refused():
    with pytest.raises(ValueError, match="17/16"):
        exact_interval(17, 16)
    with pytest.raises(ValueError):
        exact_interval(0, 0)
