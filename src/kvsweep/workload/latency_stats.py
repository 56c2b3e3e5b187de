"""Per-request statistics of a replayed mix: tail latencies with honest intervals, goodput, and what a static
cache wastes on it.

A p99 over a few hundred requests is mostly noise: `percentile_with_interval` says so by giving no interval rather
than a misleading one. Its intervals follow `kvsweep.measure.statistics` (distribution-free order statistics, the
same linear-interpolated point value), so a workload's p90 reads like a cell's median.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from kvsweep.measure.statistics import CONFIDENCE, binomial_cdf, percentile
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError


@dataclass(frozen=True)
class PercentileEstimate:
    """A percentile and its order-statistic interval; no interval when too few values can bracket it."""

    value: float
    ci_low: float | None
    ci_high: float | None
    n: int
    coverage: float | None = None  # the interval's exact coverage for continuous values (>= the confidence asked)


def _binomial_pmf(n: int, p: float) -> list[float]:
    """P(B = k) for k = 0..n, B ~ Binomial(n, p), 0 < p < 1, each term in log space (as `binomial_cdf` sums)."""
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return [
        math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        for k in range(n + 1)
    ]


def _order_statistic_ranks(n: int, p: float, confidence: float) -> tuple[int, int] | None:
    """1-based ranks (l, u), l < u, with P(l <= B <= u - 1) >= confidence; None when even (1, n) falls short."""
    if n < 2 or not 0 < p < 1:
        return None
    pmf = _binomial_pmf(n, p)
    below = [0.0, *accumulate(pmf)]  # below[k] = P(B < k), summed from the bottom...
    at_or_above = [*reversed([*accumulate(reversed(pmf))]), 0.0]  # ...at_or_above[k] = P(B >= k) from the top
    # Start at B's median (clamped to ranks 1..n-1), then widen toward whichever tail still holds more probability
    # (both on a tie): the tails left out stay as equal as whole ranks allow, and for q = 50 this is exactly
    # `median_interval`'s symmetric j-th smallest to j-th largest.
    start = next(k for k in range(n + 1) if below[k + 1] >= 0.5)
    low = min(max(start, 1), n - 1)
    high = low + 1
    while 1.0 - below[low] - at_or_above[high] < confidence:
        can_lower, can_raise = low > 1, high < n
        if not (can_lower or can_raise):
            return None
        lower_tail, upper_tail = below[low], at_or_above[high]
        tie = math.isclose(lower_tail, upper_tail, rel_tol=1e-9)
        if can_lower and (lower_tail > upper_tail or tie or not can_raise):
            low -= 1
        if can_raise and (upper_tail > lower_tail or tie or not can_lower):
            high += 1
    return low, high


def percentile_with_interval(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> PercentileEstimate:
    """The q-th percentile (q in [0, 100], linear interpolation as `statistics.percentile`) and its interval.

    Coverage rule: with n independent values the count B below the true q-th percentile is Binomial(n, q/100), so
    the order statistics x_(l) <= x_(u) (1-based) bracket it with probability P(l <= B < u) = F(u-1) - F(l-1),
    exactly for continuous values and at least that with ties. The pair is grown from B's median one rank at a time
    toward the tail holding more probability (both ranks on a tie) until it reaches `confidence`; so the interval
    is as equal-tailed as whole ranks allow and stops at the first pair that covers. When even the sample's range
    (l = 1, u = n) covers less, i.e. 1 - p^n - (1-p)^n < confidence, as for a p99 of fewer than 299 values, the
    interval is None: the caller says there are too few requests for one.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile is between 0 and 100, got {q}")
    n = len(values)
    if n == 0:
        return PercentileEstimate(math.nan, None, None, 0)
    value = percentile(values, q)
    ranks = _order_statistic_ranks(n, q / 100.0, confidence)
    if ranks is None:
        return PercentileEstimate(value, None, None, n)
    low, high = ranks
    ordered = sorted(values)
    coverage = binomial_cdf(high - 1, n, q / 100.0) - binomial_cdf(low - 1, n, q / 100.0)
    return PercentileEstimate(value, ordered[low - 1], ordered[high - 1], n, coverage)


@dataclass(frozen=True)
class RequestTiming:
    """What one replayed request took. `tpot_ms` is None for a 1-token output: it has no second token to time."""

    ttft_ms: float
    tpot_ms: float | None
    e2e_ms: float


def goodput(
    requests: Sequence[RequestTiming], slo_ttft_ms: float | None, slo_tpot_ms: float | None, span_s: float
) -> float:
    """Requests per second of the replay span that met every SLO given (None or 0: that SLO is not applied).

    Throughput that counts only the requests a user was served in time: a cache that is faster on average but
    misses the tail scores lower. A request with no TPOT (1-token output) cannot miss the TPOT SLO.
    """
    if not span_s > 0:
        raise ValueError(f"the replay span must be positive, got {span_s}")
    met = 0
    for timing in requests:
        if slo_ttft_ms and timing.ttft_ms > slo_ttft_ms:
            continue
        if slo_tpot_ms and timing.tpot_ms is not None and timing.tpot_ms > slo_tpot_ms:
            continue
        met += 1
    return met / span_s


def _batches(mix: RequestMix, batch: int) -> list[tuple[Request, ...]]:
    """Static batches of `batch` consecutive requests in mix (arrival) order; the last may be shorter."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    rows = mix.requests
    return [rows[start : start + batch] for start in range(0, len(rows), batch)]


def static_unused_share(mix: RequestMix, reserved_tokens: int, batch: int) -> float:
    """The share of a static cache's reserved token slots that the mix never writes.

    Definition: each row of each static batch (see `padding_share` for the batching) holds `reserved_tokens` slots
    for its whole life. `generate` runs every row until the batch's longest output is done, so at its end each row
    has written its prompt, left-padded to the batch's longest (P), and the batch's longest output (N) but the last
    token, which is never fed back: P + N - 1 slots, whatever its own output (sequential: its own). The share is
    1 - sum(P + N - 1) / (rows * reserved_tokens): unused slots over reserved slots, every row holding the same
    reservation. It is the reservation at its fullest: averaged over a request's life the unused share is larger.
    Padding counts as written (it is, with masked keys): `padding_share` measures that waste separately, and
    `overgeneration_share` the tokens generated past a row's own output.
    """
    if reserved_tokens < 1:
        raise ValueError(f"reserved_tokens must be positive, got {reserved_tokens}")
    written = rows = 0
    for group in _batches(mix, batch):
        padded = max(r.input_tokens for r in group)
        longest = max(r.output_tokens for r in group)
        need = padded + longest - 1
        if need > reserved_tokens:
            raise WorkloadError(
                f"a static cache of {reserved_tokens} tokens cannot hold a batch needing {need} "
                f"(prompt padded to {padded} + its longest output {longest} - 1)"
            )
        written += need * len(group)
        rows += len(group)
    return 1.0 - written / (rows * reserved_tokens)


def overgeneration_share(mix: RequestMix, batch: int) -> float:
    """The share of the tokens `generate` generates for the mix's static batches that no request asked for.

    Every row of a batch runs until the batch's longest output is done: a row whose own output is shorter makes
    (longest - own) tokens past it, computed and cached and thrown away. Share = sum(longest - own) /
    sum(longest), over every row of every batch (batches as `padding_share`'s): decode compute spent on them.
    """
    return _share_below_longest(mix, batch, lambda r: r.output_tokens)


def padding_share(mix: RequestMix, batch: int) -> float:
    """The share of prompt positions that are padding when the mix is served in static batches.

    Batches are `batch` consecutive requests in mix (arrival) order, the last one possibly shorter; every prompt
    is left-padded to its batch's longest. Share = sum(longest - input) / sum(longest * rows), over all batches:
    prefill compute and cache slots spent on pad tokens.
    """
    return _share_below_longest(mix, batch, lambda r: r.input_tokens)


def _share_below_longest(mix: RequestMix, batch: int, length: Callable[[Request], int]) -> float:
    """Over every row of every static batch: sum(the batch's longest `length` - the row's) / sum(that longest):
    what a batch run to its longest row spends on the others (padding, or tokens generated past an output)."""
    short = total = 0
    for group in _batches(mix, batch):
        longest = max(length(r) for r in group)
        short += sum(longest - length(r) for r in group)
        total += longest * len(group)
    return short / total


def compile_payback(
    compile_s: float,
    compiled_call_s: Sequence[float],
    dynamic_call_s: Sequence[float],
    rows: Sequence[int] | None = None,
) -> int | None:
    """After how many requests a compiled static cache's saving over dynamic has repaid its compile time, all in
    the server's seconds.

    A call is one `generate` call: one request (sequential) or a batch of `rows[i]` (batched; None: one each); its
    time is the server's, from being sent to its end (waiting for arrivals left out), the same call timed both ways.
    Saving i = dynamic_call_s[i] - compiled_call_s[i]: one saving per call, however many rows it served. If the
    mean saving per request (the savings' sum over the requests') is <= 0 it never pays back over a long run:
    None, even if a lucky prefix of the mix did. Otherwise the payback is the requests served by the calls up to the
    first whose running sum of savings reaches compile_s (a call's saving comes when it ends, with all its rows);
    past the end of the mix each further request is taken to save the mean per request, which makes
    ceil(compile_s / mean). compile_s = 0 pays back at once: 0; no calls at all: None.
    """
    rows = [1] * len(compiled_call_s) if rows is None else list(rows)
    if not len(compiled_call_s) == len(dynamic_call_s) == len(rows):
        raise ValueError(
            f"compiled and dynamic timings must be of the same calls: {len(compiled_call_s)} against "
            f"{len(dynamic_call_s)}, of {len(rows)} row counts"
        )
    if compile_s < 0:
        raise ValueError(f"compile_s must not be negative, got {compile_s}")
    if compile_s == 0:
        return 0
    if not compiled_call_s:
        return None
    savings = [d - c for c, d in zip(compiled_call_s, dynamic_call_s, strict=True)]
    mean = math.fsum(savings) / sum(rows)
    if mean <= 0:
        return None
    for total, served in zip(accumulate(savings), accumulate(rows), strict=True):
        if total >= compile_s:
            return served
    k = math.ceil(compile_s / mean)
    return k - 1 if (k - 1) * mean >= compile_s else k  # a quotient a rounding error above a whole number
