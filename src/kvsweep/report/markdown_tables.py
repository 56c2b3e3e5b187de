"""Markdown tables and the report's sections of tables (capacity, task quality, weights x KV cache, workloads).

What both the selection page (`markdown.py`) and the comparison (`compare/`) write tables with.
"""

from collections.abc import Sequence

from kvsweep.report.capacity_report import CapacitySection
from kvsweep.report.task_table import INTRO as TASK_TABLE_INTRO
from kvsweep.report.task_table import TaskTable
from kvsweep.report.weights_tables import INTRO as WEIGHTS_KV_INTRO
from kvsweep.report.weights_tables import WeightsKvTable
from kvsweep.report.workload_report import WorkloadSection

TableCell = str | tuple[str, str, str]  # in a report table: plain text, or (link text, url, text after the link)


def cell_markdown(cell: TableCell) -> str:
    if isinstance(cell, tuple):
        text, url, after = cell
        return f"[{escape_cell(text)}]({url}){escape_cell(after)}"
    return escape_cell(cell)


def escape_cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(header: list[str], rows: list[list[TableCell]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell_markdown(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def workload_markdown(section: WorkloadSection) -> list[str]:
    """The workload section's blocks: heading, how to read it, the interval note once, a table per group with
    its cells that produced no numbers listed under it."""
    blocks = ["## Workloads: your traffic", section.intro, *([f"_{section.note}._"] if section.note else [])]
    for t in section.tables:
        blocks += [
            f"### {escape_cell(t.title)}",
            table(t.header, t.rows) if t.rows else "No cell of this workload ran.",
        ]
        if t.failed:
            blocks.append("\n".join(f"- {escape_cell(line)}" for line in t.failed))
    return blocks


def task_quality_markdown(tables: Sequence[TaskTable]) -> list[str]:
    """The task quality section's blocks: a task x context table per model; none without a task."""
    return titled_tables_markdown("Task quality", TASK_TABLE_INTRO, tables)


def weights_kv_markdown(tables: Sequence[WeightsKvTable]) -> list[str]:
    """The weights x KV cache section's blocks; none without tables."""
    return titled_tables_markdown("Weights x KV cache", WEIGHTS_KV_INTRO, tables)


def titled_tables_markdown(heading: str, intro: str, tables: Sequence[TaskTable | WeightsKvTable]) -> list[str]:
    """A section of titled tables: its heading, how to read them, each table under its title; none without any."""
    if not tables:
        return []
    blocks = [f"## {heading}", intro]
    for t in tables:
        blocks += [f"### {escape_cell(t.title)}", table(t.header, [list(row) for row in t.rows])]
    return blocks


def capacity_markdown(section: CapacitySection) -> list[str]:
    """The capacity section's blocks: heading, how to read it, a table per model/dtype/search, the lines."""
    blocks = ["## Capacity", section.intro]
    for t in section.tables:
        blocks += [f"### {escape_cell(t.title)}", table(t.header, list(t.rows))]
    if section.lines:
        blocks += ["### Most capacity", "\n".join(f"- {escape_cell(line)}" for line in section.lines)]
    return blocks
