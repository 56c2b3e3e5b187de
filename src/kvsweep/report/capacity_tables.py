"""The capacity section of selection.md and report.html: a table per model/dtype/new tokens and search, the lines.

Rows are the sizes a search held fixed (contexts for the batch search, batch sizes for the context
search), columns the strategies, each cell the frontier: `max batch 24 · 410 tok/s · slo tpot (pred 26)`.
Plain strings, so Markdown and HTML render the same tables.

capacity.csv: one row per frontier, batch and context searches in one file, for scripts and spreadsheets.

A batch frontier fills `context_length` (the size it held) and `max_batch`; a context frontier fills
`batch_size` and `max_context`; the other pair stays empty, and `axis` says which it is. Every column is
always there (empty where a row has no value), so a script reads every sweep's file the same way.
`pick` is true on the strategy the selection recommends at that size; `quality_refusal` says why the
quality gate keeps a strategy from being recommended (empty when it does not). `joules_per_token` is the
frontier cell's own metric: the energy of all the GPUs that cell ran on (a split cell sums them,
`measure/energy.py`), as `cost_per_1m_tokens` pays for all of them (`ray.gpus_per_cell`).
"""

import csv
import io
from dataclasses import dataclass

from kvsweep.caches import cache_rank
from kvsweep.capacity.frontier import BATCH
from kvsweep.names import Metric, ci_high
from kvsweep.report.capacity_assessment import Capacity, SizeChoice, Standing, limit_mark

TableKey = tuple[str, str, str, int, str]  # axis, model, dtype, new tokens, weights


@dataclass(frozen=True)
class CapacityTable:
    title: str
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class CapacitySection:
    """What both renderers show: how to read it, the tables, and the line per size."""

    intro: str
    tables: list[CapacityTable]
    lines: list[str]


def capacity_section(capacity: Capacity) -> CapacitySection:
    return CapacitySection(_intro(capacity), capacity_tables(capacity), capacity.lines())


def _intro(capacity: Capacity) -> str:
    search = capacity.context.search
    slo = search.slo.describe()
    return (
        f"Each cell is a frontier: the largest batch (per context) or the longest context (per batch) that ran "
        f"without running out of memory{f' and met {slo}' if slo else ''}, judged on the upper end of the 95% "
        f"interval, up to search.max_batch {search.max_batch} (contexts in steps of {search.context_step}), with "
        "the decode tokens/s of the whole batch there (goodput) and what stopped it: mem (the next size ran out "
        "of memory), slo tpot / slo ttft (the next size missed the SLO), cap (the search's ceiling), or skipped, "
        "error, unfinished. pred: the planner's memory prediction. The pick at each size goes furthest, ties "
        "broken by goodput; a strategy refused for quality against dynamic (task accuracy, KL) is never picked."
    )


def _frontier_text(choice: SizeChoice, standing: Standing) -> str:
    frontier = standing.frontier
    what = "max batch" if frontier.key.axis == BATCH else "max ctx"
    parts = [f"{what} {frontier.value}" if frontier.value else "none passed"]
    goodput = frontier.goodput_tokens_per_s
    if goodput is not None:
        parts.append(f"{goodput:.0f} tok/s")
    predicted = f" (pred {frontier.predicted})" if frontier.predicted is not None else ""
    parts.append(limit_mark(frontier.limit) + predicted)
    if standing.refused:
        parts.append("refused: quality")
    if choice.pick is standing:
        parts.append("**pick**")
    return " · ".join(parts)


def capacity_tables(capacity: Capacity) -> list[CapacityTable]:
    """One table per model/dtype/new tokens and search axis, in the order of the choices."""
    grouped: dict[TableKey, list[SizeChoice]] = {}
    for choice in capacity.choices:
        axis, model, dtype, new, _, weights = choice.key
        grouped.setdefault((axis, model, dtype, new, weights), []).append(choice)
    tables = []
    for (axis, _, dtype, new, _), choices in grouped.items():
        keys = {s.frontier.key for c in choices for s in c.standings}
        labels = list(dict.fromkeys(k.strategy for k in sorted(keys, key=lambda k: (*cache_rank(k.cache), k.compile))))
        what, per = ("max batch", "context") if axis == BATCH else ("max context", "batch")
        rows = []
        for choice in sorted(choices, key=lambda c: c.key[4]):
            cells = {s.label: _frontier_text(choice, s) for s in choice.standings}
            rows.append([str(choice.key[4]), *(cells.get(label, "-") for label in labels)])
        title = f"{choices[0].model_name} {dtype} new{new}: {what} per {per}"
        tables.append(CapacityTable(title, [per, *labels], rows))
    return tables


COLUMNS = (
    "axis",
    "model",
    "dtype",
    "cache",
    "compile",
    "inputs",
    "max_new_tokens",
    "context_length",
    "batch_size",
    "max_batch",
    "max_context",
    "limit",
    "goodput_tokens_per_s",
    Metric.PREDICTED_MAX_BATCH,
    Metric.PREDICTED_MAX_CONTEXT,
    "probes",
    ci_high(Metric.TPOT_MS),
    ci_high(Metric.TTFT_MS),
    Metric.JOULES_PER_TOKEN,
    "cost_per_1m_tokens",
    "pick",
    "quality_refusal",
    "cell_id",
    "detail",
)


def capacity_csv(capacity: Capacity) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for choice in capacity.choices:
        for standing in choice.standings:
            writer.writerow(_row(choice, standing, capacity))
    return out.getvalue()


def _blank(value: object) -> object:
    return "" if value is None else value


def _row(choice: SizeChoice, standing: Standing, capacity: Capacity) -> list[object]:
    frontier, key = standing.frontier, standing.frontier.key
    batch = key.axis == BATCH
    metrics = frontier.at.metrics if frontier.at is not None else {}
    goodput = frontier.goodput_tokens_per_s
    sizes = [key.fixed, "", frontier.value, ""] if batch else ["", key.fixed, "", frontier.value]
    predicted = [frontier.predicted, None] if batch else [None, frontier.predicted]
    return [
        key.axis,
        key.model,
        key.dtype,
        key.cache,
        key.compile,
        key.inputs,
        key.max_new_tokens,
        *sizes,
        frontier.limit,
        _blank(goodput),
        *map(_blank, predicted),
        frontier.probes,
        _blank(metrics.get(ci_high(Metric.TPOT_MS))),
        _blank(metrics.get(ci_high(Metric.TTFT_MS))),
        _blank(metrics.get(Metric.JOULES_PER_TOKEN)),
        _blank(capacity.context.cost_per_1m_tokens(goodput)),
        str(choice.pick is standing).lower(),
        "; ".join(standing.gate.refusals),
        frontier.at.cell_id if frontier.at is not None else "",
        frontier.detail,
    ]
