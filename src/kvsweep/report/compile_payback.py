"""When compiling a static cache pays for itself on a workload: after how many of the mix's requests.

A compiled cell of a workload records what compiling cost it (`compile_s`: its cold replay of the mix beyond its
measured one) and every request's time; the same workload's dynamic cell (eager) timed the same requests. The
saving of each request is dynamic's end-to-end time less the compiled one's; `compile_payback` (workload
package) turns those into a count, or "never" when the compiled cache is not faster on average.
"""

from collections.abc import Iterable

from kvsweep.caches import BASELINE
from kvsweep.names import Metric, ResultTag
from kvsweep.results import OK, CellResult
from kvsweep.workload.latency_stats import compile_payback

REQUESTS = "requests"  # the samples key of a workload cell's per-request records (workload_cell.py)


def payback(compiled: CellResult, group: list[CellResult]) -> int | str | None:
    """Requests until `compiled` has repaid its compile time against the group's dynamic cell; None: never.
    A text instead when it cannot be told (not compiled, no dynamic cell, the samples not at hand)."""
    if not compiled.cell.compile or Metric.COMPILE_S not in compiled.metrics:
        return "-"
    dynamic = next((r for r in group if r.cell.cache == BASELINE and not r.cell.compile and r.status == OK), None)
    if dynamic is None:
        return "no dynamic cell"
    mine, theirs = compiled.samples.get(REQUESTS), dynamic.samples.get(REQUESTS)
    if not mine or not theirs or len(mine) != len(theirs):
        return "needs both cells' requests (samples.json)"
    compiled_s = [r[Metric.E2E_MS] / 1e3 for r in mine]
    dynamic_s = [r[Metric.E2E_MS] / 1e3 for r in theirs]
    return compile_payback(compiled.metrics[Metric.COMPILE_S], compiled_s, dynamic_s)


def payback_text(compiled: CellResult, group: list[CellResult]) -> str:
    found = payback(compiled, group)
    if found is None:
        return "never"
    return found if isinstance(found, str) else f"{found} requests"


def payback_findings(
    groups: Iterable[list[CellResult]],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """(metrics, tags) by cell id for each compiled workload cell whose payback can be told, for its MLflow run:
    `compile_payback_requests` where compiling pays back, and the `kvsweep.compile_payback` tag ("12 requests" or
    "never"). `groups`: the workload groups (`workload_report.workload_groups`: one mix, serving mode and B each),
    a compiled cell set against its group's dynamic cell; one that cannot be told (no dynamic cell, or a report
    rebuilt without the samples) gets nothing, so a rebuilt report never overwrites what the sweep found."""
    metrics: dict[str, dict[str, float]] = {}
    tags: dict[str, dict[str, str]] = {}
    for group in groups:
        for result in group:
            if not result.cell.compile or result.status != OK:
                continue
            found = payback(result, group)
            if isinstance(found, str):
                continue
            if found is not None:
                metrics[result.cell_id] = {Metric.COMPILE_PAYBACK_REQUESTS: float(found)}
            tags[result.cell_id] = {ResultTag.COMPILE_PAYBACK: payback_text(result, group)}
    return metrics, tags
