"""The comparison's files: compare.csv (one row per cell and metric, for scripts), compare.md (the
header and every row, regressions first), compare.html (the same with a B/A figure per metric,
self-contained like the report page).
"""

import csv
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path

from kvsweep.compare.comparison import Comparison, Row
from kvsweep.compare.figures import draw_ratios
from kvsweep.compare.tables import HEADER, counts, header_lines, ordered, row_cells
from kvsweep.grid import CELL_FIELDS
from kvsweep.report.html_page import STYLE, html_table, inline_image
from kvsweep.report.markdown import table

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
