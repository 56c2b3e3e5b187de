"""Paired comparisons between cells that served the same requests or answered the same trials.

A workload cell's reference is its group's dynamic cell (eager: same mix, serving mode, B and rate): both replayed
the very same requests, so `fill_paired_ratios` sets each other cell's `paired_ratio_ttft/tpot/e2e` (+ interval)
from its requests' own ratios, onto the result (the selection reads them) and for its MLflow run (a report rebuilt
from MLflow reads them back). Two quality cells of one group answered the same trials (`task.jsonl`):
`paired_trials` lines them up for McNemar's test. The statistics are `measure/paired.py`'s.
"""

from collections.abc import Iterable
from typing import Any

from kvsweep.caches import BASELINE
from kvsweep.measure.paired import PairedAccuracy, PairedRatio, paired_accuracy, paired_ratio
from kvsweep.names import Metric, ci_high, ci_low
from kvsweep.results import OK, CellResult

REQUESTS = "requests"  # the samples key of a workload cell's per-request records (workload_cell.py)
# Each paired metric and the per-request timing it is the ratio of (a request record's keys are the metric names)
PAIRED = {
    Metric.PAIRED_RATIO_TTFT: Metric.TTFT_MS,
    Metric.PAIRED_RATIO_TPOT: Metric.TPOT_MS,
    Metric.PAIRED_RATIO_E2E: Metric.E2E_MS,
}
RATIO_OF = {timing: paired for paired, timing in PAIRED.items()}  # ttft_ms -> paired_ratio_ttft


def request_series(result: CellResult, timing: str) -> list[float | None] | None:
    """Each replayed request's `timing` in replay order; None when the cell kept no requests (a rebuilt report)."""
    requests = result.samples.get(REQUESTS) if result.status == OK else None
    if not requests:
        return None
    return [r.get(timing) for r in requests]


def _same_requests(a: CellResult, b: CellResult) -> bool:
    """Both replayed the same mix: as many requests, each of the same lengths, in the same order."""
    mine, theirs = a.samples.get(REQUESTS) or [], b.samples.get(REQUESTS) or []
    shape = [(r.get("input_tokens"), r.get("output_tokens")) for r in mine]
    return bool(mine) and shape == [(r.get("input_tokens"), r.get("output_tokens")) for r in theirs]


def pair(mine: CellResult, reference: CellResult, timing: str) -> PairedRatio | None:
    """mine / reference on `timing`, request by request; None without both cells' requests or on another mix."""
    if not _same_requests(mine, reference):
        return None
    a, b = request_series(mine, timing), request_series(reference, timing)
    return paired_ratio(a, b) if a is not None and b is not None else None


def logged_ratio(result: CellResult, timing: str) -> PairedRatio | None:
    """The paired ratio on `timing` the result carries (worked out live, or read back from MLflow)."""
    name = RATIO_OF.get(timing)
    m = result.metrics
    if name is None or name not in m or ci_low(name) not in m or ci_high(name) not in m:
        return None
    pairs = int(m.get(Metric.REPEATS, 0))
    return PairedRatio(m[name], m[ci_low(name)], m[ci_high(name)], pairs, 0.95 if pairs >= 6 else 0.0)


def reference_of(group: list[CellResult]) -> CellResult | None:
    """The group's reference: its dynamic cell (eager) that ran."""
    return next((r for r in group if r.cell.cache == BASELINE and not r.cell.compile and r.status == OK), None)


def fill_paired_ratios(groups: Iterable[list[CellResult]]) -> dict[str, dict[str, float]]:
    """For every ok workload cell but the reference of its group (one mix, serving mode, B and rate), its paired
    ratios to the reference, set on the result; returned by cell id for the cells' MLflow runs. A cell already
    carrying them (read back from MLflow) or without requests at hand is left alone."""
    found: dict[str, dict[str, float]] = {}
    for group in groups:
        reference = reference_of(group)
        if reference is None:
            continue
        for result in group:
            if result is reference or result.status != OK or Metric.PAIRED_RATIO_E2E in result.metrics:
                continue
            metrics: dict[str, float] = {}
            for name, timing in PAIRED.items():
                ratio = pair(result, reference, timing)
                if ratio is not None:
                    metrics |= {name: ratio.ratio, ci_low(name): ratio.low, ci_high(name): ratio.high}
            if metrics:
                result.metrics.update(metrics)
                found[result.cell_id] = metrics
    return found


def _trial_key(trial: dict[str, Any]) -> tuple:
    """What makes two cells' trials the same question: its kind, index and seed, and the expected answer."""
    return (trial.get("kind"), trial.get("prompt_index"), trial.get("seed"), str(trial.get("expected")))


def paired_trials(mine: CellResult, reference: CellResult, task: str | None = None) -> PairedAccuracy | None:
    """McNemar's test on the trials of `task` (a trial's `kind`; None: all of them) both cells answered; None when
    either kept no such trials or they do not share them all (a cell logged before trials were kept: the
    independent intervals decide then)."""
    ours = [t for t in mine.trials if task is None or t.get("kind") == task]
    theirs = {_trial_key(t): bool(t.get("correct")) for t in reference.trials if task is None or t.get("kind") == task}
    pairs = [(bool(t.get("correct")), theirs[_trial_key(t)]) for t in ours if _trial_key(t) in theirs]
    if not pairs or len(pairs) != len(ours) or len(pairs) != len(theirs):
        return None
    return paired_accuracy([a for a, _ in pairs], [b for _, b in pairs])
