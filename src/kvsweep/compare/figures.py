"""One figure per metric: B/A for every cell both sweeps measured, with the ratio's range as error
bars, the threshold as a band around 1, regressions in red and improvements in green, contended
cells hollow. Log scale, so 2x slower and 2x faster sit equally far from 1.
"""

import math
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.ticker import FormatStrFormatter

from kvsweep.compare.comparison import Comparison, Row
from kvsweep.compare.judging import CONTENDED, IMPROVEMENTS
from kvsweep.compare.metrics import COMPARED
from kvsweep.grid import cell_label

COLOURS = {"regression": "#c62828", "improvement": "#2e7d32", "other": "#607d8b"}


def _colour(row: Row) -> str:
    if row.regression:
        return COLOURS["regression"]
    return COLOURS["improvement"] if row.verdict in IMPROVEMENTS else COLOURS["other"]


def _finite_positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def draw_ratios(comparison: Comparison, out_dir: Path) -> list[Path]:
    """`ratio_<metric>.png` for each metric with at least one finite ratio; their paths, in metric order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for compared in COMPARED:
        rows = [r for r in comparison.rows if r.metric == compared.name and _finite_positive(r.ratio)]
        if not rows:
            continue
        path = out_dir / f"ratio_{compared.name}.png"
        _figure(compared.name, rows, comparison.thresholds.of(compared.name)).savefig(path, dpi=110)
        paths.append(path)
    return paths


def _figure(metric: str, rows: list[Row], threshold: float) -> Figure:
    fig = Figure(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.2), layout="constrained")
    ax = fig.subplots()
    ax.axhspan(1 / (1 + threshold), 1 + threshold, color="#eeeeee", zorder=0, label=f"threshold {threshold:.2f}")
    ax.axhline(1.0, color="#999999", linewidth=0.8)
    for i, row in enumerate(rows):
        r = float(row.ratio or 1.0)
        low = row.ratio_low if _finite_positive(row.ratio_low) else r
        high = row.ratio_high if _finite_positive(row.ratio_high) else r
        colour = _colour(row)
        face = "none" if row.verdict == CONTENDED else colour
        ax.errorbar(
            [i], [r], yerr=[[max(r - low, 0.0)], [max(high - r, 0.0)]], fmt="o", color=colour, mfc=face, capsize=3
        )
        if row.regression:
            ax.annotate(row.verdict, (i, r), textcoords="offset points", xytext=(4, 6), fontsize=7, color=colour)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))  # 0.9, 1, 2 rather than 9x10^-1
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
    ax.set_xticks(range(len(rows)), [cell_label(r.cell) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("B / A")
    ax.set_title(f"{metric}: B / A per cell (red: regression, green: improvement, hollow: contended)", fontsize=9)
    ax.legend(loc="upper left", fontsize=7)
    return fig
