"""Per-request statistics against hand arithmetic: binomial sums by math.comb, small mixes worked in comments."""

import math
import random
from fractions import Fraction

import pytest

from kvsweep.measure.statistics import median_interval
from kvsweep.workload.latency_stats import (
    RequestTiming,
    compile_payback,
    goodput,
    overgeneration_share,
    padding_share,
    percentile_with_interval,
    static_unused_share,
)
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError


def exact_coverage(n: int, share: Fraction, low: int, high: int) -> Fraction:
    """P(low <= B <= high - 1) for B ~ Binomial(n, share), in exact rationals."""
    return sum((math.comb(n, i) * share**i * (1 - share) ** (n - i) for i in range(low, high)), Fraction(0))


def shuffled(n: int) -> list[float]:
    values = [float(v) for v in range(1, n + 1)]
    random.Random(n).shuffle(values)
    return values


def test_the_median_interval_of_twenty_is_the_sixth_to_fifteenth_value():
    n = 20
    # The largest j whose x_(j)..x_(n-j+1) covers the median with >= 95%: P(j <= B <= n - j), B ~ Bin(20, 1/2).
    j = max(j for j in range(1, n // 2 + 1) if sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2**n >= 0.95)
    assert (j, n - j + 1) == (6, 15)
    estimate = percentile_with_interval(shuffled(n), 50)
    assert (estimate.ci_low, estimate.ci_high) == (6.0, 15.0)  # values 1..20: x_(k) = k
    assert estimate.value == 10.5 and estimate.n == 20
    # 1 - 2 * P(B <= 5) = 1 - 2 * (1 + 20 + 190 + 1140 + 4845 + 15504) / 2^20 = 1 - 43400 / 1048576 ~ 0.9586
    assert estimate.coverage == pytest.approx(1 - 43400 / 2**20, abs=1e-12)


def test_the_median_matches_the_cells_median_interval():
    for n in range(6, 80):
        values = shuffled(n)
        mine, cells = percentile_with_interval(values, 50), median_interval(values)
        assert (mine.ci_low, mine.ci_high) == (cells.low, cells.high), n
    # Below 6 values even the range covers the median less than 95% (5 values: 1 - 2/32 = 0.9375): the cell's
    # interval is the range with its coverage told; a workload's percentile has none.
    assert median_interval(shuffled(5)).coverage < 0.95
    assert percentile_with_interval(shuffled(5), 50).ci_low is None


def test_a_p99_of_298_values_has_no_interval_and_of_299_one():
    # Even the sample's range misses the p99 too often below 299 values: 1 - 0.99^n - 0.01^n < 0.95.
    assert 1 - 0.99**298 - 0.01**298 < 0.95 <= 1 - 0.99**299 - 0.01**299
    none = percentile_with_interval(shuffled(298), 99)
    assert (none.ci_low, none.ci_high, none.coverage) == (None, None, None)
    assert none.value == pytest.approx(1 + 297 * 0.99)  # linear interpolation at rank (n - 1) * 0.99
    some = percentile_with_interval(shuffled(299), 99)
    assert some.ci_high == 299.0  # 0.99^299 = 0.0496 of the mass is at B = 299: only the top value leaves it out
    assert exact_coverage(299, Fraction(99, 100), int(some.ci_low), int(some.ci_high)) >= Fraction(95, 100)


@pytest.mark.parametrize(("n", "q"), [(100, 90), (50, 90), (1000, 10), (500, 99)])
def test_a_tail_interval_covers_and_no_narrower_pair_beside_it_does(n, q):
    estimate = percentile_with_interval(shuffled(n), q)
    low, high = int(estimate.ci_low), int(estimate.ci_high)
    share = Fraction(q, 100)
    covered = exact_coverage(n, share, low, high)
    assert covered >= Fraction(95, 100)
    assert float(covered) == pytest.approx(estimate.coverage, abs=1e-9)
    # Dropping either end loses the 95%: the pair is as tight as whole ranks allow on both sides.
    assert exact_coverage(n, share, low + 1, high) < Fraction(95, 100)
    assert exact_coverage(n, share, low, high - 1) < Fraction(95, 100)
    # Neither tail left out is over the whole 5%: the interval leans to neither side.
    assert exact_coverage(n, share, 0, low) <= Fraction(5, 100)
    assert exact_coverage(n, share, high, n + 1) <= Fraction(5, 100)
    assert estimate.ci_low <= estimate.value <= estimate.ci_high


def test_percentiles_with_no_possible_interval():
    assert percentile_with_interval([3.0], 50).ci_low is None  # one value brackets nothing
    assert percentile_with_interval(shuffled(1000), 100).ci_high is None  # nothing is above the maximum
    assert percentile_with_interval(shuffled(1000), 0).ci_low is None
    empty = percentile_with_interval([], 90)
    assert math.isnan(empty.value) and empty.n == 0 and empty.ci_low is None
    with pytest.raises(ValueError):
        percentile_with_interval([1.0], 101)


def test_goodput_counts_requests_that_met_every_slo_per_second():
    timings = [
        RequestTiming(ttft_ms=100, tpot_ms=20, e2e_ms=500),  # meets both
        RequestTiming(ttft_ms=300, tpot_ms=20, e2e_ms=700),  # TTFT 300 > 200: misses
        RequestTiming(ttft_ms=150, tpot_ms=45, e2e_ms=900),  # TPOT 45 > 40: misses
        RequestTiming(ttft_ms=200, tpot_ms=None, e2e_ms=200),  # 1-token output at the TTFT limit: meets
    ]
    assert goodput(timings, slo_ttft_ms=200, slo_tpot_ms=40, span_s=4.0) == 2 / 4.0
    assert goodput(timings, slo_ttft_ms=200, slo_tpot_ms=None, span_s=4.0) == 3 / 4.0  # only TTFT applies
    assert goodput(timings, slo_ttft_ms=0, slo_tpot_ms=0, span_s=2.0) == 4 / 2.0  # none applies: throughput
    with pytest.raises(ValueError):
        goodput(timings, None, None, span_s=0.0)


MIX = RequestMix("hand", (Request(100, 10), Request(300, 50), Request(200, 20), Request(200, 5), Request(50, 1)))


def test_padding_share_of_static_batches():
    # batch 2: [100, 300] pads 200 of 2 * 300 = 600; [200, 200] pads 0 of 400; [50] alone pads 0 of 50.
    assert padding_share(MIX, batch=2) == pytest.approx(200 / (600 + 400 + 50))
    # batch 3: [100, 300, 200] pads 200 + 0 + 100 of 900; [200, 50] pads 0 + 150 of 400.
    assert padding_share(MIX, batch=3) == pytest.approx((300 + 150) / (900 + 400))
    assert padding_share(MIX, batch=1) == 0.0
    with pytest.raises(ValueError):
        padding_share(MIX, batch=0)


def test_static_unused_share_of_a_reservation():
    # batch 1, 400 slots per request; written = input + output - 1:
    # 109 + 349 + 219 + 204 + 50 = 931 of 5 * 400 = 2000 -> 1 - 931/2000
    assert static_unused_share(MIX, reserved_tokens=400, batch=1) == pytest.approx(1 - 931 / 2000)
    # batch 2: generate runs both rows of a batch to its longest output, each padded to its longest prompt:
    # [(100, 10), (300, 50)]: 2 x (300 + 50 - 1) = 698; [(200, 20), (200, 5)]: 2 x (200 + 20 - 1) = 438;
    # [(50, 1)]: 50. The (200, 5) row writes 219 slots, not the 204 its own output would.
    assert static_unused_share(MIX, reserved_tokens=400, batch=2) == pytest.approx(1 - (698 + 438 + 50) / 2000)
    # The longest request needs 300 + 50 - 1 = 349 slots: 349 fits exactly, 348 cannot hold it.
    assert static_unused_share(RequestMix("one", (Request(300, 50),)), 349, 1) == 0.0
    with pytest.raises(WorkloadError, match="cannot hold a batch needing 349"):
        static_unused_share(MIX, reserved_tokens=348, batch=1)
    # (100 in, 4 out) and (8 in, 60 out) batched: both rows pad to 100 and run to 60: 159 slots each, a 159-slot
    # reservation full; sequential, each writes its own: 103 and 67 of 103.
    pair = RequestMix("pair", (Request(100, 4), Request(8, 60)))
    assert static_unused_share(pair, 159, batch=2) == 0.0
    assert static_unused_share(pair, 103, batch=1) == pytest.approx(1 - (103 + 67) / 206)


def test_overgeneration_share_of_static_batches():
    # batch 2: [10, 50] runs both to 50: 40 past the first's own; [20, 5]: 15 past; [1] alone: none.
    # generated: 2 x 50 + 2 x 20 + 1 = 141
    assert overgeneration_share(MIX, batch=2) == pytest.approx((40 + 15) / 141)
    # batch 3: [10, 50, 20] to 50: 40 + 0 + 30 of 150; [5, 1] to 5: 4 of 10
    assert overgeneration_share(MIX, batch=3) == pytest.approx((70 + 4) / 160)
    assert overgeneration_share(MIX, batch=1) == 0.0  # one request a call stops at its own output
    with pytest.raises(ValueError):
        overgeneration_share(MIX, batch=0)


def test_compile_payback():
    # Saving 2 s a request, 3 requests save 6 of 10 s; past the mix the mean (2 s) repays: ceil(10 / 2) = 5.
    assert compile_payback(10.0, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]) == 5
    # Savings 5, 1, 6: the running sum reaches 6 at the second request.
    assert compile_payback(6.0, [1.0, 1.0, 1.0], [6.0, 2.0, 7.0]) == 2
    # Savings 5 and -5: a mean of 0 never repays, though the first request alone would have.
    assert compile_payback(4.0, [1.0, 6.0], [6.0, 1.0]) is None
    assert compile_payback(4.0, [2.0], [1.0]) is None  # compiled is slower
    assert compile_payback(0.0, [2.0], [1.0]) == 0
    # 1.1 / 0.1 is 11.000000000000002 in floats: eleven requests of 0.1 s do repay 1.1 s.
    assert compile_payback(1.1, [0.1], [0.2]) == 11
    with pytest.raises(ValueError):
        compile_payback(1.0, [1.0, 2.0], [3.0])


def test_compile_payback_of_batched_calls():
    # Calls of 2, 2 and 1 rows, each 1 s faster compiled: one saving a call. 2 s of compiling: repaid when the
    # second call ends, with its rows: 4 requests.
    assert compile_payback(2.0, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], rows=[2, 2, 1]) == 4
    # 4 s: past the mix's 3 s over 5 requests, 0.6 s a request: ceil(4 / 0.6) = 7.
    assert compile_payback(4.0, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], rows=[2, 2, 1]) == 7
    with pytest.raises(ValueError):
        compile_payback(1.0, [1.0, 2.0], [3.0, 4.0], rows=[2])
