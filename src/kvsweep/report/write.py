"""Write a sweep's report into a folder (plots/, selection.md, report.html) and its tables (results.csv/.txt).

Plots: one figure per facet, and a `_quality` figure beside it where cells have task accuracy or KL.

The same function serves the end of a live sweep (folder `<run dir>/report`, then logged on the
parent run under `report/`) and `python -m kvsweep report` (from MLflow alone).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsweep.names import REPORT_DIR
from kvsweep.report.html_page import render_page
from kvsweep.report.markdown import intro, selection_markdown, short_form
from kvsweep.report.plots import draw_facets
from kvsweep.report.selection import Decision, Settings, decide, quality_loss_tags
from kvsweep.report.table import results_csv, results_table
from kvsweep.results import CellResult

__all__ = ["REPORT_DIR", "Report", "ReportContext", "settings_from", "write_report", "write_tables"]


@dataclass
class ReportContext:
    title: str
    settings: Settings
    links: dict[str, str] = field(default_factory=dict)  # cell id -> its MLflow run page
    parent_url: str = ""


@dataclass
class Report:
    folder: Path
    decisions: list[Decision]
    plots: list[Path]

    @property
    def short_form(self) -> str:
        return short_form(self.decisions)

    @property
    def quality_tags(self) -> dict[str, dict[str, str]]:
        """Cell id -> its `kvsweep.quality_loss` tag: the verdicts this report decided by, for MLflow."""
        return quality_loss_tags(self.decisions)


def settings_from(values: dict[str, Any]) -> Settings:
    """From the config's `report` section or the parent run's `report.*` params (strings)."""
    return Settings.from_values(values)


def write_report(results: list[CellResult], folder: Path, context: ReportContext) -> Report:
    folder.mkdir(parents=True, exist_ok=True)
    decisions = decide(results, context.settings)
    plots = draw_facets(results, folder / "plots", max_kl=context.settings.max_kl)
    (folder / "selection.md").write_text(selection_markdown(context.title, decisions, context.links))
    page = render_page(context.title, intro(decisions), decisions, plots, context.links, context.parent_url)
    (folder / "report.html").write_text(page)
    return Report(folder, decisions, plots)


def write_tables(results: list[CellResult], folder: Path) -> str:
    """`results.csv` and `results.txt` (the terminal table, returned): once per sweep, in its run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    table = results_table(results)
    (folder / "results.csv").write_text(results_csv(results))
    (folder / "results.txt").write_text(table)
    return table
