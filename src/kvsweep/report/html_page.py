"""The report as one self-contained HTML file: tables, plots inlined as data URIs, links to MLflow.

Nothing is fetched when the page opens (no scripts, fonts or images from elsewhere), so it can be
mailed, attached to a ticket or opened on an air-gapped machine.
"""

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from kvsweep.report.capacity_report import CapacitySection
from kvsweep.report.markdown import decision_rows, evidence_rows
from kvsweep.report.markdown_tables import TableCell
from kvsweep.report.selection import Decision
from kvsweep.report.table import Listing
from kvsweep.report.task_table import INTRO as TASK_TABLE_INTRO
from kvsweep.report.task_table import TaskTable, task_tables
from kvsweep.report.weights_tables import INTRO as WEIGHTS_KV_INTRO
from kvsweep.report.weights_tables import WeightsKvTable, origin_notes
from kvsweep.report.workload_report import WorkloadSection

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0 2em; }
.muted { color: #666; font-size: 13px; }
"""


def _cell(cell: TableCell) -> str:
    if isinstance(cell, tuple):
        text, url, after = cell
        return f'<a href="{html.escape(url)}">{html.escape(text)}</a>{html.escape(after)}'
    return _bold(html.escape(cell))


def _bold(text: str) -> str:
    """Markdown's **x** (the picks in the evidence table) as <b>x</b>."""
    parts = text.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def html_table(header: list[str], rows: list[list[TableCell]], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td{_num_class(c)}>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _num_class(cell: TableCell) -> str:
    if isinstance(cell, str) and cell.replace(".", "", 1).replace("-", "", 1).replace("e", "", 1).isdigit():
        return ' class="num"'
    return ""


def inline_image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _capacity(section: CapacitySection) -> list[str]:
    """Heading, how to read it, a table per model/dtype/search, the line per size."""
    parts = ["<h2>Capacity</h2>", f'<p class="muted">{html.escape(section.intro)}</p>']
    for i, t in enumerate(section.tables):
        parts += [f"<h3>{html.escape(t.title)}</h3>", html_table(t.header, list(t.rows), f"capacity-{i}")]
    if section.lines:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in section.lines)
        parts += ["<h3>Most capacity</h3>", f'<ul id="capacity-lines">{items}</ul>']
    return parts


def _titled_tables(heading: str, intro: str, tables: Sequence[TaskTable | WeightsKvTable], ids: str) -> list[str]:
    """A section of titled tables (the table ids `<ids>-0`, `-1`...); none without any."""
    if not tables:
        return []
    parts = [f'<h2 id="{ids}">{html.escape(heading)}</h2>', f'<p class="muted">{html.escape(intro)}</p>']
    for i, t in enumerate(tables):
        rows: list[list[TableCell]] = [list(row) for row in t.rows]
        parts += [f"<h3>{html.escape(t.title)}</h3>", html_table(t.header, rows, f"{ids}-{i}")]
    return parts


def _workloads(section: WorkloadSection) -> list[str]:
    """Heading, how to read it, the interval note once, then per group its figure, its table and its cells that
    produced no numbers."""
    parts = ['<h2 id="workloads">Workloads: your traffic</h2>', f'<p class="muted">{html.escape(section.intro)}</p>']
    parts += [f'<p class="muted">{html.escape(section.note)}.</p>'] if section.note else []
    for i, t in enumerate(section.tables):
        parts.append(f"<h3>{html.escape(t.title)}</h3>")
        parts += [inline_image(t.plot)] if t.plot else []
        parts.append(
            html_table(t.header, t.rows, f"workload-{i}") if t.rows else "<p>No cell of this workload ran.</p>"
        )
        if t.failed:
            parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in t.failed) + "</ul>")
    return parts


def render_page(
    title: str,
    intro: str,
    decisions: list[Decision],
    plots: list[Path],
    links: dict[str, str],
    parent_url: str,
    listing: Listing | None = None,
    capacity: CapacitySection | None = None,
    weights_kv: Sequence[WeightsKvTable] = (),
    workloads: WorkloadSection | None = None,
) -> str:
    """The decision table lists `listing.listed` (default: every decision), the evidence table every decision;
    `workloads`: the workload section (its figures inline), when the sweep replayed request mixes."""
    parent = f'<p>MLflow sweep run: <a href="{html.escape(parent_url)}">{html.escape(parent_url)}</a></p>'
    listing = listing or Listing(decisions)
    if not decisions:
        listed = "<p>No cells.</p>"
    elif listing.listed:
        listed = html_table(*decision_rows(listing.listed, links), "decision")
    else:
        listed = "<p>No group to choose in.</p>"
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        parent if parent_url else "",
        f'<p class="muted">{html.escape(intro)}</p>',
        *(f"<p>{html.escape(note)}</p>" for note in origin_notes(decisions)),
        *(_capacity(capacity) if capacity else []),
        "<h2>Decision</h2>",
        f'<p class="muted">{html.escape(listing.note())}.</p>' if listing.left_out else "",
        listed,
        "<h2>Evidence</h2>",
        html_table(*evidence_rows(decisions, links), "evidence") if decisions else "",
        *_titled_tables("Task quality", TASK_TABLE_INTRO, task_tables(decisions), "task-quality"),
        *_titled_tables("Weights x KV cache", WEIGHTS_KV_INTRO, weights_kv, "weights-kv"),
        *(_workloads(workloads) if workloads else []),
        "<h2>Plots</h2>",
        *(f"<h3>{html.escape(p.stem)}</h3>{inline_image(p)}" for p in plots),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(s for s in sections if s)
        + "</body></html>\n"
    )
