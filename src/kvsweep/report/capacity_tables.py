"""The capacity section of selection.md and report.html: a table per model/dtype/new tokens and search, the lines.

Rows are the sizes a search held fixed (contexts for the batch search, batch sizes for the context
search), columns the strategies, each cell the frontier: `max batch 24 · 410 tok/s · slo tpot (pred 26)`.
Plain strings, so Markdown and HTML render the same tables.
"""

from dataclasses import dataclass

from kvsweep.caches import cache_rank
from kvsweep.capacity.frontier import BATCH
from kvsweep.report.capacity import Capacity, SizeChoice, Standing, limit_mark

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
