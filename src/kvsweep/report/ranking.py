"""What a selection group is ranked by, and when two of its cells cannot be told apart.

A fixed-shape group ranks its cells by the median of `report.rank_by` over repeats (independent samples: two cells
are tied when their 95% intervals overlap). A workload group ranks by a percentile over requests (`rank_by`'s own,
e.g. `tpot_ms_p99`, or p90 by default: a server is judged by its slow requests), but only by a percentile that
the number of requests can give an interval: where n cannot bracket it (a p90 needs 29 requests, a p99 299), the
highest percentile below it that can is ranked instead, and the line says so. Its cells replayed the same
requests, so two of them are tied when the median of their per-request ratios is not told from 1
(`measure/paired.py`); only without the requests at hand (a report rebuilt from MLflow) do the percentiles'
independent intervals decide.
"""

from dataclasses import dataclass

from kvsweep.measure.paired import TIED, PairedAccuracy, paired_accuracy
from kvsweep.measure.statistics import CiBounds, fewest_for_interval, metric_interval, overlaps
from kvsweep.names import Metric, ci_high, ci_low
from kvsweep.report.paired_verdicts import REQUESTS, pair
from kvsweep.results import OK, CellResult

PERCENTILES = (99, 90, 50)  # a workload cell's logged percentiles, highest first
DEFAULT_PERCENTILE = 90


@dataclass(frozen=True)
class Ranking:
    """The metric a group is ranked by (`tpot_ms`, `tpot_ms_p90`), the timing it is a percentile of, and why it is
    not the one asked for ('' when it is)."""

    metric: str
    timing: str
    workload: bool
    note: str = ""

    @property
    def short(self) -> str:
        """'tpot' or 'tpot p90': how the line names it."""
        name = self.timing.removesuffix("_ms")
        return f"{name} {self.metric.rsplit('_', 1)[1]}" if self.workload else name


def split_rank_by(rank_by: str) -> tuple[str, int | None]:
    """`tpot_ms_p99` -> (`tpot_ms`, 99); `tpot_ms` -> (`tpot_ms`, None)."""
    head, _, tail = rank_by.rpartition("_p")
    return (head, int(tail)) if head and tail.isdigit() else (rank_by, None)


def _has_interval(result: CellResult, metric: str) -> bool:
    m = result.metrics
    return metric in m and ci_low(metric) in m and ci_high(metric) in m


def group_ranking(results: list[CellResult], rank_by: str) -> Ranking:
    """The ranking of one group: the median of a fixed shape; a workload's highest percentile at or below the one
    asked for that every cell that ran can bracket."""
    timing, asked = split_rank_by(rank_by)
    ran = [r for r in results if r.status == OK and any(name.startswith(timing) for name in r.metrics)]
    if not any(r.cell.is_workload for r in results):
        return Ranking(timing, timing, workload=False)
    asked = asked or DEFAULT_PERCENTILE
    tried = [q for q in PERCENTILES if q <= asked]
    for q in tried:
        if ran and all(_has_interval(r, f"{timing}_p{q}") for r in ran):
            note = "" if q == asked else _fallback_note(ran, asked, q)
            return Ranking(f"{timing}_p{q}", timing, True, note)
    lowest = tried[-1] if tried else 50
    requests = min((int(r.metrics.get(Metric.REPEATS, 0)) for r in ran), default=0)
    note = f"no interval: {requests} requests give none (a p{lowest} needs {fewest_for_interval(lowest)})"
    return Ranking(f"{timing}_p{lowest}", timing, True, note)


def _fallback_note(ran: list[CellResult], asked: int, used: int) -> str:
    """'ranked by p50: 12 requests give no p90 interval (29 do)'."""
    requests = min(int(r.metrics.get(Metric.REPEATS, 0)) for r in ran)
    return f"ranked by p{used}: {requests} requests give no p{asked} interval ({fewest_for_interval(asked)} do)"


def ranked_interval(result: CellResult, ranking: Ranking) -> CiBounds | None:
    """The ranked metric's 95% interval; None when a workload cell has none (no winner is named on a point)."""
    if ranking.workload and not _has_interval(result, ranking.metric):
        return None
    return metric_interval(result.metrics, ranking.metric)


def tied(a: CellResult, b: CellResult, ranking: Ranking, timing: str | None = None) -> tuple[bool, str]:
    """(whether a and b cannot be told apart on `timing` (the ranked one by default), the test that said so)."""
    timing = timing or ranking.timing
    if ranking.workload:
        ratio = pair(a, b, timing)
        if ratio is not None:
            return ratio.verdict == TIED, "paired sign test"
    metric = ranking.metric if timing == ranking.timing else timing
    if ranking.workload and not (_has_interval(a, metric) and _has_interval(b, metric)):
        return True, "no interval"
    # a fixed shape's median always carries its interval; a result from before intervals were logged is a point
    return overlaps(metric_interval(a.metrics, metric), metric_interval(b.metrics, metric)), "independent intervals"


def slo_met(request: dict, slo_ttft_ms: float, slo_tpot_ms: float) -> bool:
    """A replayed request met every SLO set (0: not applied; a 1-token output has no TPOT to miss)."""
    if slo_ttft_ms and request.get(Metric.TTFT_MS, 0.0) > slo_ttft_ms:
        return False
    tpot = request.get(Metric.TPOT_MS)
    return not (slo_tpot_ms and tpot is not None and tpot > slo_tpot_ms)


def paired_goodput(a: CellResult, b: CellResult, slo_ttft_ms: float, slo_tpot_ms: float) -> PairedAccuracy | None:
    """McNemar's test on which requests met the SLOs under a and under b (the same requests); None without them."""
    mine, theirs = a.samples.get(REQUESTS) or [], b.samples.get(REQUESTS) or []
    if not mine or len(mine) != len(theirs):
        return None
    return paired_accuracy(
        [slo_met(r, slo_ttft_ms, slo_tpot_ms) for r in mine], [slo_met(r, slo_ttft_ms, slo_tpot_ms) for r in theirs]
    )
