"""The capacity section of selection.md and report.html, capacity.csv, and the capacity figure.

A table per model/dtype/new tokens and search: rows the sizes a search held fixed, columns the strategies, each
cell the frontier (`max batch 24 · 410 tok/s · slo tpot (pred 26)`), plain strings so Markdown and HTML render
the same. capacity.csv (columns: docs/report.md) has one row per frontier of either axis and every column always,
empty where a row has no value, so a script reads every sweep's file the same way. `joules_per_token` is the
frontier cell's own, all its GPUs summed (`measure/energy.py`), as `cost_per_1m_tokens` pays for all of them.

The figure: a panel per search and new-tokens value, a line per strategy, the marker saying what stopped the
frontier, the prediction dotted, a strategy the quality gate refuses hollow and dashed.
"""

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.lines import Line2D

from kvsweep.caches import cache_rank
from kvsweep.capacity.frontier import BATCH, MAX_BATCH, MAX_CONTEXT, MEMORY, SLO_TPOT, SLO_TTFT
from kvsweep.model_names import file_stem
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


CAPACITY_SUFFIX = "_capacity"
MARKERS = {MEMORY: "s", SLO_TPOT: "v", SLO_TTFT: "v", MAX_BATCH: "^", MAX_CONTEXT: "^"}  # anything else: "X"
LEGEND = (("s", "memory-limited"), ("v", "SLO-limited"), ("^", "search ceiling"), ("X", "stopped otherwise"))
Panel = tuple[str, int]  # axis, new tokens


def draw_capacity(capacity: Capacity, palette: dict[str, str], out_dir: Path) -> list[Path]:
    """Writes `<model>_<dtype>_capacity.png` per model/dtype into out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[tuple[str, str, str], list[SizeChoice]] = {}
    for choice in capacity.choices:  # quantized weights get figures of their own (the name says which)
        figures.setdefault((choice.key[1], choice.key[2], choice.key[5]), []).append(choice)
    paths = []
    for (_, dtype, _), choices in sorted(figures.items()):
        name = choices[0].model_name
        path = out_dir / f"{file_stem(name)}_{dtype}{CAPACITY_SUFFIX}.png"
        _figure(name, dtype, choices, palette, capacity.context.search.slo.describe()).savefig(path, dpi=100)
        paths.append(path)
    return paths


def _figure(name: str, dtype: str, choices: list[SizeChoice], palette: dict[str, str], slo: str) -> Figure:
    panels = sorted({(c.axis, c.key[3]) for c in choices}, key=lambda p: (p[0] != BATCH, p[1]))
    figure = Figure(figsize=(7.5 * len(panels), 5.5), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    figure.suptitle(f"{name} {dtype}: capacity{f' within {slo} (95% upper end)' if slo else ' (memory only)'}")
    for ax, panel in zip(axes, panels, strict=True):
        _panel(ax, panel, [c for c in choices if (c.axis, c.key[3]) == panel], palette)
    return figure


def _panel(ax: Axes, panel: Panel, choices: list[SizeChoice], palette: dict[str, str]) -> None:
    axis, new = panel
    series: dict[str, list[Standing]] = {}
    for choice in sorted(choices, key=lambda c: c.key[4]):
        for standing in choice.standings:
            series.setdefault(standing.label, []).append(standing)
    for label, standings in series.items():
        _series(ax, label, standings, palette.get(label, "black"))
    sizes = sorted({c.key[4] for c in choices})
    ax.set_xlabel("context length (tokens)" if axis == BATCH else "batch size")
    ax.set_ylabel("max batch" if axis == BATCH else "max context (tokens)")
    ax.set_title(f"{'max batch per context' if axis == BATCH else 'max context per batch'}, {new} new tokens")
    if sizes and sizes[-1] >= 4 * sizes[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    keys = [Line2D([], [], marker=m, linestyle="none", color="black", label=text) for m, text in LEGEND]
    keys.append(Line2D([], [], linestyle=":", color="black", label="planner's prediction (memory)"))
    ax.legend(handles=[*handles, *keys], fontsize=8, loc="best")


def _series(ax: Axes, label: str, standings: list[Standing], colour: str) -> None:
    xs = [s.frontier.key.fixed for s in standings]
    refused = any(s.refused for s in standings)
    ax.plot(
        xs,
        [s.frontier.value for s in standings],
        color=colour,
        linestyle="--" if refused else "-",
        label=f"{label} (refused: quality)" if refused else label,
    )
    for x, standing in zip(xs, standings, strict=True):
        marker = MARKERS.get(standing.frontier.limit, "X")
        hollow = "none" if standing.refused else "full"
        ax.plot([x], [standing.frontier.value], marker=marker, markersize=9, color=colour, fillstyle=hollow)
    predicted = [(x, s.frontier.predicted) for x, s in zip(xs, standings, strict=True) if s.frontier.predicted]
    if predicted:
        ax.plot(*zip(*predicted, strict=True), color=colour, linestyle=":", linewidth=1.2, alpha=0.8)
