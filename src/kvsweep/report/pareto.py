"""The memory-vs-TPOT panel: every cell that ran, and the frontier of cells nothing beats on both."""

from collections import defaultdict

from matplotlib.axes import Axes

from kvsweep.grid import strategy_label
from kvsweep.names import Metric, ResultTag
from kvsweep.results import OK, CellResult
from kvsweep.units import MIB


def _has(result: CellResult, metric: str) -> bool:
    return result.status == OK and result.metrics.get(metric) is not None


def draw_pareto(ax: Axes, results: list[CellResult], palette: dict[str, str], basis: str) -> None:
    """Memory against TPOT for every cell that ran; the frontier joins cells nothing beats on both."""
    points = [
        (r.metrics[basis] / MIB, r.metrics[Metric.TPOT_MS], r)
        for r in results
        if _has(r, basis) and _has(r, Metric.TPOT_MS)
    ]
    for x, y, r in points:
        hollow = r.tags.get(ResultTag.CONTENDED) == "true"
        colour = palette[strategy_label(r.cell)]
        ax.scatter([x], [y], s=40, zorder=3, color="none" if hollow else colour, edgecolors=colour)
        ax.annotate(str(r.cell.context_length), (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7)
    by_context: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for x, y, r in points:
        by_context[int(r.cell.context_length)].append((x, y))
    drawn = False
    for context_points in by_context.values():
        frontier = pareto_frontier(context_points)
        if len(frontier) > 1:
            ax.plot(
                *zip(*frontier, strict=True),
                color="grey",
                linestyle=":",
                linewidth=1.2,
                label=None if drawn else "Pareto frontier (per context)",
            )
            drawn = True
    if drawn:
        ax.legend(fontsize=8)
    label = "peak GPU memory" if basis == Metric.PEAK_DEVICE_MEM_BYTES else "KV cache"
    ax.set_title(f"{label} vs time per output token (labels: context)")
    ax.set_xlabel(f"{label} (MiB)")
    ax.set_ylabel("TPOT (ms)")
    ax.grid(alpha=0.3)


def pareto_frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(memory, latency) points that no other point beats on both, by increasing memory."""
    frontier: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not frontier or y < frontier[-1][1]:
            frontier.append((x, y))
    return frontier
