"""How the forecast did, cell by cell: each cell's `forecast_ratio` (what it took ÷ what was forecast), coloured by
strategy, on a log axis around 1, with the ×2 band the forecast aims within. Cells far outside it name where the
forecast is wrong (a term it misjudges for a cache, a model, a device) before the next sweep is budgeted on it."""

import statistics
from pathlib import Path

from matplotlib.figure import Figure

from kvsweep.grid import strategy_label
from kvsweep.names import Metric
from kvsweep.results import CellResult

FILE_NAME = "forecast_ratio.png"
AIM = 2.0  # the band the forecast aims within on a calibrated device


def draw_forecast(results: list[CellResult], palette: dict[str, str], out_dir: Path) -> Path | None:
    """`plots/forecast_ratio.png`, or None when no cell has a forecast ratio."""
    rated = [r for r in results if Metric.FORECAST_RATIO in r.metrics]
    if not rated:
        return None
    rated.sort(key=lambda r: (strategy_label(r.cell), r.metrics[Metric.FORECAST_RATIO]))
    figure = Figure(figsize=(max(6.0, 0.25 * len(rated) + 2), 4.5), layout="constrained")
    ax = figure.subplots()
    shown: set[str] = set()
    for x, result in enumerate(rated):
        label = strategy_label(result.cell)
        ax.scatter(
            x,
            result.metrics[Metric.FORECAST_RATIO],
            color=palette.get(label, "black"),
            label=None if label in shown else label,
        )
        shown.add(label)
    ratios = [r.metrics[Metric.FORECAST_RATIO] for r in rated]
    low, high = min(*ratios, 1 / AIM), max(*ratios, AIM)
    ax.set_yscale("log")
    ax.set_ylim(low / 1.2, high * 1.2)
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.axhspan(1 / AIM, AIM, color="grey", alpha=0.1, label=f"within {AIM:g}x")
    ax.set_xticks([])
    ax.set_xlabel(f"cells ({len(rated)}), by strategy")
    ax.set_ylabel("took ÷ forecast (cell_wall_s / forecast_s)")
    total = sum(r.wall_s for r in rated) / sum(r.metrics[Metric.FORECAST_S] for r in rated)
    median = statistics.median(ratios)
    ax.set_title(f"Forecast: cells took {median:.2g}x their forecast (median), {total:.2g}x in total")
    ax.legend(loc="best", fontsize="small")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILE_NAME
    figure.savefig(path, dpi=100)
    return path
