"""Whether one probe passes: it ran (no OOM) and meets the SLO, judged on its 95% intervals' upper ends.

A median under the SLO with an interval reaching over it has not shown it meets the SLO: a serving team
sizes for what it can promise, so the search judges the upper end, never the median.
"""

from dataclasses import dataclass

from kvsweep.names import Metric, ci_high
from kvsweep.results import OK, OOM, SKIPPED, CellResult

MEMORY, SLO_TPOT, SLO_TTFT = "memory", "slo_tpot", "slo_ttft"
MAX_BATCH, MAX_CONTEXT = "search.max_batch", "search.max_context"
SKIP, FAILED, UNFINISHED = "skipped", "error", "unfinished"  # the frontier could not be found


@dataclass(frozen=True)
class Slo:
    """What a probe must meet; 0 leaves a bound unset."""

    tpot_ms: float = 0.0
    ttft_ms: float = 0.0

    def describe(self) -> str:
        parts = [
            f"tpot <= {self.tpot_ms:g} ms" if self.tpot_ms else "",
            f"ttft <= {self.ttft_ms:g} ms" if self.ttft_ms else "",
        ]
        return " and ".join(p for p in parts if p)


@dataclass(frozen=True)
class Verdict:
    passes: bool
    limit: str = ""  # why not: memory | slo_tpot | slo_ttft | skipped | error
    detail: str = ""  # the numbers or the message behind it, for the report's line

    @property
    def decisive(self) -> bool:
        """A probe that passed or failed for a reason that grows with size (memory, the SLO): the search goes on.
        Anything else (an error, a timeout, a skip) stops its frontier where it stands."""
        return self.passes or self.limit in (MEMORY, SLO_TPOT, SLO_TTFT)


def upper_end(result: CellResult, metric: str) -> float | None:
    """The upper end of the metric's 95% interval; the median where no interval was recorded."""
    return result.metrics.get(ci_high(metric), result.metrics.get(metric))


def probe_verdict(result: CellResult, slo: Slo) -> Verdict:
    if result.status == OOM:
        return Verdict(False, MEMORY, result.error)
    if result.status == SKIPPED:
        return Verdict(False, SKIP, result.error)
    if result.status != OK:
        return Verdict(False, FAILED, f"{result.status}: {result.error}")
    for bound, metric, limit in ((slo.tpot_ms, Metric.TPOT_MS, SLO_TPOT), (slo.ttft_ms, Metric.TTFT_MS, SLO_TTFT)):
        high = upper_end(result, metric)
        if bound and (high is None or high > bound):
            seen = "not measured" if high is None else f"{high:.3g} ms at the 95% upper end"
            return Verdict(False, limit, f"{metric} {seen} > {bound:g} ms")
    return Verdict(True)
