"""What a strategy costs against dynamic in its group: each timing and memory as a fraction, with its uncertainty.

A fixed shape's +- adds both medians' relative half-widths in quadrature (`statistics.ratio_error`); a workload's
timings are compared at the ranked percentile, and its uncertainty is the per-request paired ratios' interval
(`paired_verdicts.py`), printed beside them with the sign test's verdict.
"""

from kvsweep.measure.paired import PairedRatio
from kvsweep.measure.statistics import ratio_error
from kvsweep.names import Metric
from kvsweep.report.constraints import LABELS, LATENCIES, at_rank, label
from kvsweep.report.paired_verdicts import logged_ratio, pair
from kvsweep.report.ranking import Ranking
from kvsweep.report.selection_entry import Entry
from kvsweep.results import CellResult


def vs_dynamic(entry: Entry, first: bool = False) -> str:
    """'; TPOT -12% ±3%, ... vs dynamic' after a pick's speed ('TPOT ... vs dynamic' alone when `first`)."""
    parts = cost_text(entry)
    if not parts:
        return ""
    return ("" if first else "; ") + parts + " vs dynamic"


def cost_text(entry: Entry) -> str:
    """'TPOT -12% ±3%, TTFT +3% ±2%, memory +30%' relative to dynamic (a workload's at its ranked percentile, then
    the per-request paired medians: 'per request: TTFT +2% [+0%, +4%] tied'); empty for dynamic itself."""
    text = ", ".join(f"{name} {pct(v)}{_pm(entry.errors.get(name))}" for name, v in entry.deltas.items())
    paired = [f"{LABELS[t]} {r.change()} {r.verdict}" for t, r in entry.paired.items()]
    if paired:
        text += ("; " if text else "") + "per request (paired): " + ", ".join(paired)
    return text


def _pm(error: float | None) -> str:
    return "" if error is None else f" ±{error * 100:.0f}%"


def pct(fraction: float) -> str:
    return f"{fraction * 100:+.0f}%"


def costs(
    result: CellResult, dynamic: CellResult, basis: str, ranking: Ranking
) -> tuple[dict[str, float], dict[str, float]]:
    """(fraction vs dynamic, +- on it) by label: TPOT, TTFT and e2e at the ranked statistic, and memory. A fixed
    shape's +- adds both medians' relative half-widths in quadrature; a workload's uncertainty is its paired
    ratios' (`paired_ratios`)."""
    deltas, errors = {}, {}
    timings = LATENCIES if ranking.workload else (Metric.TPOT_MS, Metric.TTFT_MS)
    if not ranking.workload and ranking.timing not in timings:
        timings = (*timings, ranking.timing)
    for timing in timings:
        metric = at_rank(timing, ranking)
        mine, theirs = result.metrics.get(metric), dynamic.metrics.get(metric)
        if mine is not None and theirs:
            name = label(timing, ranking)
            deltas[name] = mine / theirs - 1
            error = None if ranking.workload else ratio_error(result.metrics, dynamic.metrics, metric)
            if error is not None:
                errors[name] = error
    mine, theirs = result.metrics.get(basis), dynamic.metrics.get(basis)
    if mine is not None and theirs:
        deltas["memory"] = mine / theirs - 1
    return deltas, errors


def paired_ratios(result: CellResult, dynamic: CellResult) -> dict[str, PairedRatio]:
    """The per-request ratios to dynamic on the same requests (worked out here, or read back from MLflow)."""
    found = {}
    for timing in (Metric.TTFT_MS, Metric.TPOT_MS, Metric.E2E_MS):
        ratio = pair(result, dynamic, timing) or logged_ratio(result, timing)
        if ratio is not None:
            found[timing] = ratio
    return found
