"""What keeps a cache from being picked although it wins on what is ranked: slower than the reference beyond
`report.max_slowdown` on another latency, or past an SLO.

A tie on TPOT must not hand the pick to a cache whose every first token is twice as slow: each latency the user
did not waive (`report.waive_slowdown`) is compared with the group's reference (its dynamic cell) at the ranked
statistic: the median of a fixed shape, the ranked percentile over requests of a workload. The best estimate
decides (a cache whose TTFT is measured 12% slower with a 10% allowance is not shipped on the chance that it is
not), and the line names the slowdown that kept it out (`quantized-hqq-int4: TTFT +103% > 10%`).
"""

from dataclasses import dataclass

from kvsweep.names import Metric
from kvsweep.report.ranking import Ranking
from kvsweep.results import CellResult

LATENCIES = (Metric.TTFT_MS, Metric.TPOT_MS, Metric.E2E_MS)
LABELS = {Metric.TTFT_MS: "TTFT", Metric.TPOT_MS: "TPOT", Metric.E2E_MS: "E2E"}
TOLERANCE = 1e-9  # a slowdown exactly at the allowance is within it


def at_rank(timing: str, ranking: Ranking) -> str:
    """The metric `timing` is compared at: its median, or the ranked percentile (`ttft_ms_p90`)."""
    if not ranking.workload:
        return timing
    return f"{timing}_{ranking.metric.rsplit('_', 1)[1]}"


def label(timing: str, ranking: Ranking) -> str:
    """'TTFT', or 'TTFT p90' for a workload."""
    suffix = f" {ranking.metric.rsplit('_', 1)[1]}" if ranking.workload else ""
    return LABELS.get(timing, timing) + suffix


@dataclass(frozen=True)
class Slowdown:
    timing: str
    fraction: float  # mine / reference - 1
    label: str

    def text(self, allowed: float) -> str:
        """'TTFT +103% > 10%'."""
        return f"{self.label} {self.fraction:+.0%} > {allowed:.0%}"


def slowdowns(result: CellResult, reference: CellResult, ranking: Ranking, waived: tuple[str, ...]) -> list[Slowdown]:
    """`result` against `reference` on every latency not waived that both measured."""
    found = []
    for timing in LATENCIES:
        if timing in waived:
            continue
        metric = at_rank(timing, ranking)
        mine, theirs = result.metrics.get(metric), reference.metrics.get(metric)
        if mine is not None and theirs:
            found.append(Slowdown(timing, mine / theirs - 1, label(timing, ranking)))
    return found


def beyond(
    result: CellResult,
    reference: CellResult | None,
    ranking: Ranking,
    settings_slowdown: float,
    waived: tuple[str, ...],
) -> list[str]:
    """Why `result` may not be picked on speed grounds: each latency slower than the allowance ('' none)."""
    if reference is None or result is reference:
        return []
    return [
        s.text(settings_slowdown)
        for s in slowdowns(result, reference, ranking, waived)
        if s.fraction > settings_slowdown + TOLERANCE
    ]


def slo_misses(result: CellResult, ranking: Ranking, slo_ttft_ms: float, slo_tpot_ms: float) -> list[str]:
    """SLOs the cell misses at the ranked statistic: a fixed shape by its interval's upper end (as the capacity
    search judges a probe), a workload by its ranked percentile over requests."""
    misses = []
    for timing, slo in ((Metric.TTFT_MS, slo_ttft_ms), (Metric.TPOT_MS, slo_tpot_ms)):
        if not slo:
            continue
        metric = at_rank(timing, ranking)
        value = result.metrics.get(metric if ranking.workload else f"{metric}_ci_high", result.metrics.get(metric))
        if value is not None and value > slo:
            misses.append(f"{label(timing, ranking)} {value:.1f} ms > SLO {slo:g} ms")
    return misses
