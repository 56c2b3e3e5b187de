"""The results table: a compact terminal view and the CSV logged on the sweep's parent run."""

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass

from kvsweep.caches import cache_rank
from kvsweep.grid import CELL_FIELDS, cell_label, serving_label, strategy_label
from kvsweep.model_names import display_names
from kvsweep.names import Metric, ResultTag, task_of_metric, task_partial_metric, task_trials_metric, with_interval
from kvsweep.report.selection import Decision
from kvsweep.report.task_accuracy import quality_score, task_accuracies
from kvsweep.results import CellResult
from kvsweep.units import MIB

CSV_METRICS = (
    *with_interval(Metric.TTFT_MS),
    Metric.TTFT_MS_P90,
    *with_interval(Metric.TPOT_MS),
    Metric.TPOT_MS_P90,
    Metric.DECODE_TOKENS_PER_S,
    Metric.PREFILL_TOKENS_PER_S,
    *with_interval(Metric.E2E_MS),
    Metric.FIRST_CALL_MS,
    Metric.KV_CACHE_BYTES,
    Metric.KV_CACHE_BYTES_DENSE,
    Metric.PEAK_DEVICE_MEM_BYTES,
    Metric.PEAK_HOST_RSS_BYTES,
    Metric.TOKEN_AGREEMENT,
    Metric.FIRST_DIVERGENCE,
    Metric.REPEATS,
    Metric.DISCARDED_CALLS,
    Metric.HOST_OTHER_CPU_SHARE,
    Metric.HOST_STEAL_SHARE,
    Metric.KL_DIVERGENCE,
    *with_interval(Metric.PASSKEY_ACCURACY),
    *with_interval(Metric.ANSWER_ACCURACY),
    Metric.TASK_TRIALS,
)


def results_csv(results: Iterable[CellResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    results = list(results)
    metrics = [*CSV_METRICS, *_suite_columns(results)]
    writer.writerow(["cell_id", *CELL_FIELDS, "status", "error", "contended", "contention", *metrics])
    for r in results:
        writer.writerow(
            [
                r.cell_id,
                *(getattr(r.cell, f) for f in CELL_FIELDS),
                r.status,
                r.error,
                r.tags.get(ResultTag.CONTENDED, "unknown"),
                r.tags.get(ResultTag.CONTENTION, ""),
                *(r.metrics.get(m, "") for m in metrics),
            ]
        )
    return out.getvalue()


def _suite_columns(results: list[CellResult]) -> list[str]:
    """The suite tasks' columns of the cells that ran them (each task's accuracy, interval, trials, partial)."""
    columns: list[str] = []
    for accuracy in {a.metric: a for r in results for a in task_accuracies(r.metrics)}.values():
        task = task_of_metric(accuracy.metric)
        if accuracy.metric in CSV_METRICS or task is None:
            continue
        columns += [*with_interval(accuracy.metric), task_trials_metric(task), task_partial_metric(task)]
    return columns


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


HEADER = ("model", "dtype", "ctx", "bs", "new", "cache", "status", "ttft ms", "tpot ms", "tok/s", "kv MiB")
HEADER += ("dense MiB", "peak MiB", "agree", "task")


def results_table(results: Iterable[CellResult]) -> str:
    """One line per cell, sorted like the grid, numbers in the units people read (models by display name)."""
    results = sorted(results, key=_order)
    names = display_names(r.cell.model for r in results)
    rows = [list(HEADER), *(_row(r, names[r.cell.model]) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    notes = _notes(results, names)
    return "\n".join(lines + (["", *notes] if notes else []))


def _row(r: CellResult, model_name: str) -> list[str]:
    m, c = r.metrics, r.cell
    peak = m.get(Metric.PEAK_DEVICE_MEM_BYTES, m.get(Metric.PEAK_HOST_RSS_BYTES))
    status = r.status + ("*" if r.tags.get(ResultTag.CONTENDED) == "true" else "")
    status += "!" if r.tags.get(ResultTag.IMPLAUSIBLE) == "true" else ""
    return [
        model_name,
        c.dtype,
        c.workload if c.is_workload else str(c.context_length),  # a workload cell: its mix, then its serving
        str(c.batch_size),
        serving_label(c) if c.is_workload else str(c.max_new_tokens),
        strategy_label(c),
        status,
        _fmt(m.get(Metric.TTFT_MS), digits=2),
        _fmt(m.get(Metric.TPOT_MS), digits=2),
        _fmt(m.get(Metric.DECODE_TOKENS_PER_S), digits=0),
        _fmt(m.get(Metric.KV_CACHE_BYTES), MIB, 2),
        _fmt(m.get(Metric.KV_CACHE_BYTES_DENSE), MIB, 2),
        _fmt(peak, MIB, 0),
        _fmt(m.get(Metric.TOKEN_AGREEMENT), digits=2),
        _fmt(score[1] if (score := quality_score(m)) else None, digits=2),
    ]


def _notes(results: list[CellResult], names: dict[str, str]) -> list[str]:
    notes = [f"  {r.status}: {cell_label(r.cell, names[r.cell.model])}: {r.error}" for r in results if r.error]
    if any(r.tags.get(ResultTag.CONTENDED) == "true" for r in results):
        notes.append(
            "  * measured while other processes took the cell's CPUs or shared its GPU "
            f"(tag {ResultTag.CONTENDED}=true; {ResultTag.CONTENTION} says what was seen)"
        )
    if any(r.tags.get(ResultTag.IMPLAUSIBLE) == "true" for r in results):
        notes.append(f"  ! decode faster than the device's memory bandwidth allows (tag {ResultTag.IMPLAUSIBLE}=true)")
    return notes


def _order(r: CellResult) -> tuple:
    c = r.cell
    return (
        c.model,
        c.dtype,
        c.batch_size,
        c.context_length,
        c.max_new_tokens,
        *cache_rank(c.cache),
        c.compile,
    )


@dataclass(frozen=True)
class Listing:
    listed: list[Decision]
    left_out: int = 0

    def note(self) -> str:
        if not self.left_out:
            return ""
        groups = "group" if self.left_out == 1 else "groups"
        return (
            f"{self.left_out} single-strategy {groups} left out of the decision list: capacity probes, where each "
            "batch/context one strategy's search probed is a model/dtype/batch/context group with nothing to "
            "choose between (its cells are in the evidence table, its frontier in the capacity section)"
        )


def list_decisions(decisions: list[Decision], results: list[CellResult]) -> Listing:
    """Every decision; in a sweep with search probes (`kvsweep.search`), those with more than one strategy."""
    if not any(r.tags.get(ResultTag.SEARCH) for r in results):
        return Listing(decisions)
    listed = [d for d in decisions if len(d.entries) > 1]
    return Listing(listed, len(decisions) - len(listed))
