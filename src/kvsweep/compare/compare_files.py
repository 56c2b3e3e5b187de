"""One figure per metric: B/A for every cell both sweeps measured, with the ratio's range as error
bars, the threshold as a band around 1, regressions in red and improvements in green, contended
cells hollow. Log scale, so 2x slower and 2x faster sit equally far from 1.

The comparison's files: compare.csv (one row per cell and metric, for scripts), compare.md (the
header and every row, regressions first), compare.html (the same with a B/A figure per metric,
self-contained like the report page).
"""

import csv
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.ticker import FormatStrFormatter

from kvsweep.compare.comparison import Comparison, Row
from kvsweep.compare.judging import COMPARED, CONTENDED, IMPROVEMENTS
from kvsweep.compare.tables import HEADER, counts, header_lines, ordered, row_cells
from kvsweep.grid import CELL_FIELDS, cell_label
from kvsweep.report.html_page import STYLE, html_table, inline_image
from kvsweep.report.markdown_tables import table

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


COMPARE_CSV, COMPARE_MD, COMPARE_HTML = "compare.csv", "compare.md", "compare.html"
CSV_COLUMNS = (
    *CELL_FIELDS,
    "metric",
    "a",
    "b",
    "ratio",
    "ratio_low",
    "ratio_high",
    "threshold",
    "verdict",
    "regression",
    "a_run_id",
    "b_run_id",
)


@dataclass(frozen=True)
class Written:
    folder: Path
    files: list[Path]


def _plain(x: float | str | None) -> object:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return x


def compare_csv(comparison: Comparison) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for r in ordered(comparison.rows):
        numbers = (r.a, r.b, r.ratio, r.ratio_low, r.ratio_high, r.threshold)
        cell = (getattr(r.cell, f) for f in CELL_FIELDS)
        verdict = (r.verdict, str(r.regression).lower())
        writer.writerow([*cell, r.metric, *map(_plain, numbers), *verdict, r.a_run, r.b_run])
    return out.getvalue()


def compare_markdown(comparison: Comparison) -> str:
    title = f"# kvsweep compare: {comparison.a.name} -> {comparison.b.name}"
    header = "\n".join(f"- {line}" for line in header_lines(comparison))
    rows = [list(row_cells(r)) for r in ordered(comparison.rows)]
    return f"{title}\n\n{header}\n\n{counts(comparison)}\n\n{table(HEADER, rows)}\n"


def compare_html(comparison: Comparison, figures: list[Path]) -> str:
    title = f"kvsweep compare: {comparison.a.name} -> {comparison.b.name}"
    links = [(s, label) for s, label in ((comparison.a, "A"), (comparison.b, "B")) if s.url]
    runs = "".join(f'<li>{label}: <a href="{html.escape(s.url)}">{html.escape(s.url)}</a></li>' for s, label in links)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in header_lines(comparison))
    rows: list[Row] = ordered(comparison.rows)
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        f"<ul>{runs}</ul>" if runs else "",
        f'<ul class="muted">{items}</ul>',
        f"<p><b>{html.escape(counts(comparison))}</b></p>",
        "<h2>Every cell and metric (regressions first)</h2>",
        html_table(HEADER, [list(row_cells(r)) for r in rows], "compare"),
        "<h2>B / A per metric</h2>",
        *(f"<h3>{html.escape(p.stem)}</h3>{inline_image(p)}" for p in figures),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(s for s in sections if s)
        + "</body></html>\n"
    )


def write_comparison(comparison: Comparison, folder: Path) -> Written:
    """Writes the three files (and the figures the page inlines) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    figures = draw_ratios(comparison, folder / "figures")
    files = {COMPARE_CSV: compare_csv(comparison), COMPARE_MD: compare_markdown(comparison)}
    files[COMPARE_HTML] = compare_html(comparison, figures)
    for name, text in files.items():
        (folder / name).write_text(text)
    return Written(folder, [folder / name for name in files] + figures)
