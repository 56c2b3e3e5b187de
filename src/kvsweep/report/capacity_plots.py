"""One capacity figure per model/dtype: how far each strategy goes, and what stopped it.

A panel per search and new-tokens value: max batch against context (batch search), max context against
batch (context search), one line per strategy in the colours of the other figures. The marker says what
stopped the frontier, so a memory wall and an SLO wall are told apart at a glance; the planner's memory
prediction is a dotted line beside it, and a strategy refused for quality is drawn hollow and dashed.
"""

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.lines import Line2D

from kvsweep.capacity.frontier import BATCH, MAX_BATCH, MAX_CONTEXT, MEMORY, SLO_TPOT, SLO_TTFT
from kvsweep.model_names import file_stem
from kvsweep.report.capacity_assessment import Capacity, SizeChoice, Standing

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
