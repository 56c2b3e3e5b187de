"""When compiling a static cache pays for itself on a workload: after how many of the mix's requests.

Everything is in the server's seconds. A compiled cell of a workload records what compiling cost it (`compile_s`:
its cold replay's `generate` calls' time beyond its measured replay's, waiting for arrivals left out) and, per
request, the call that served it and that call's time (`service_ms`); the same workload's dynamic cell (eager) made
the same calls. The saving is per call: dynamic's call time less the compiled one's, one saving per `generate` call
however many rows a batch holds, with no arrival queueing in it (queueing compounds under open-loop arrivals and is
no work the server did). `compile_payback` (workload package) turns those into a count of requests, or "never"
when the compiled cache is not faster on average. Continuous batching (`paged`) is never compiled: no payback.
Samples written before requests carried their call and its time cannot tell, and say so.
"""

from collections.abc import Iterable
from typing import Any

from kvsweep.caches import BASELINE
from kvsweep.names import Metric, ResultTag
from kvsweep.results import OK, CellResult
from kvsweep.workload.latency_stats import compile_payback

REQUESTS = "requests"  # the samples key of a workload cell's per-request records (workload_cell.py)
CALL, SERVICE_MS = "call", "service_ms"  # a record's `generate` call and that call's time (workload_replay.py)


def call_times(records: list[dict[str, Any]]) -> tuple[list[float], list[int]] | None:
    """Each `generate` call's server seconds and its rows, in call order, from a cell's request records; None when
    the records do not carry them (written before they did, or served by continuous batching)."""
    calls: dict[int, tuple[float, int]] = {}
    for record in records:
        call, service_ms = record.get(CALL), record.get(SERVICE_MS)
        if call is None or service_ms is None:
            return None
        calls[call] = (service_ms / 1e3, calls.get(call, (0.0, 0))[1] + 1)
    order = sorted(calls)
    return [calls[c][0] for c in order], [calls[c][1] for c in order]


def payback(compiled: CellResult, group: list[CellResult]) -> int | str | None:
    """Requests until `compiled` has repaid its compile time against the group's dynamic cell; None: never.
    A text instead when it cannot be told (not compiled, no dynamic cell, the samples not at hand or too old)."""
    if not compiled.cell.compile or Metric.COMPILE_S not in compiled.metrics:
        return "-"
    dynamic = next((r for r in group if r.cell.cache == BASELINE and not r.cell.compile and r.status == OK), None)
    if dynamic is None:
        return "no dynamic cell"
    mine, theirs = compiled.samples.get(REQUESTS), dynamic.samples.get(REQUESTS)
    if not mine or not theirs or len(mine) != len(theirs):
        return "needs both cells' requests (samples.json)"
    compiled_calls, dynamic_calls = call_times(mine), call_times(theirs)
    if compiled_calls is None or dynamic_calls is None:
        return "needs both cells' call times (older samples lack them)"
    if compiled_calls[1] != dynamic_calls[1]:
        return "the cells' calls differ"
    rows = compiled_calls[1]
    return compile_payback(compiled.metrics[Metric.COMPILE_S], compiled_calls[0], dynamic_calls[0], rows)


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
