"""Write a sweep's report into a folder (plots/, selection.md, report.html) and its tables (results.csv/.txt/.json).

One function for the end of a live sweep (`<run dir>/report`, then logged on the parent run under `report/`) and
`python -m kvsweep report` (from MLflow alone); with a capacity search, its figures and `capacity.csv` too; with
workload cells offered rates (`workload.rate`), `saturation.csv` and the load-level figures.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsweep.capacity.frontier import Frontier
from kvsweep.names import CAPACITY_CSV, PARETO_CSV, REPORT_DIR, RESULTS_JSON
from kvsweep.report.capacity_assessment import Capacity, CapacityContext, assess
from kvsweep.report.capacity_report import capacity_csv, capacity_section, draw_capacity
from kvsweep.report.compile_payback import payback_findings
from kvsweep.report.forecast_figure import draw_forecast
from kvsweep.report.html_page import render_page
from kvsweep.report.load_levels import with_load_levels
from kvsweep.report.markdown import intro, selection_markdown, short_form
from kvsweep.report.paired_verdicts import fill_paired_ratios
from kvsweep.report.pareto_table import pareto_csv
from kvsweep.report.plots import colours, draw_facets
from kvsweep.report.results_json import results_json
from kvsweep.report.saturation import load_lines
from kvsweep.report.selection import Decision, Settings, decide, quality_loss_tags
from kvsweep.report.table import Listing, list_decisions, results_csv, results_table
from kvsweep.report.weights_tables import weights_kv_tables
from kvsweep.report.workload_quality import fill_agreement
from kvsweep.report.workload_report import WorkloadSection, workload_groups, workload_section
from kvsweep.results import CellResult

__all__ = [
    "REPORT_DIR",
    "CapacityContext",
    "Report",
    "ReportContext",
    "settings_from",
    "write_report",
    "write_results_json",
    "write_tables",
]


@dataclass
class ReportContext:
    title: str
    settings: Settings
    links: dict[str, str] = field(default_factory=dict)  # cell id -> its MLflow run page
    parent_url: str = ""
    capacity: CapacityContext | None = None  # a sweep with search.batch or search.contexts: its frontiers


@dataclass
class Report:
    folder: Path
    decisions: list[Decision]
    plots: list[Path]
    capacity: Capacity | None = None
    listing: Listing | None = None  # the decisions the short form lists (a search's lone probes left out)
    workloads: WorkloadSection | None = None  # a sweep with workload cells: their figures and tables
    found_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # cell id -> numbers worked out here
    found_tags: dict[str, dict[str, str]] = field(default_factory=dict)  # cell id -> tags worked out here
    load: list[str] = field(default_factory=list)  # per mix offered rates: what sustains the highest within SLOs

    @property
    def short_form(self) -> str:
        listing = self.listing or Listing(self.decisions)
        lines = [self.capacity.heading(), *self.capacity.lines()] if self.capacity else []
        text = short_form(listing.listed, listing.note(), lines)
        if self.load:  # across serving modes and caches: the highest offered rate sustained within the SLOs
            text += "\nLoad levels (highest offered rate sustained within the SLOs, across caches and serving):\n"
            text += "\n".join(f"  {line}" for line in self.load)
        return text

    @property
    def frontiers(self) -> list[Frontier]:
        return self.capacity.frontiers if self.capacity else []

    @property
    def quality_tags(self) -> dict[str, dict[str, str]]:
        """Cell id -> its `kvsweep.quality_loss` tag: the verdicts this report decided by, for MLflow."""
        return quality_loss_tags(self.decisions)

    @property
    def frontier_tags(self) -> dict[str, dict[str, str]]:
        """Cell id of each frontier's probe -> `kvsweep.frontier` and `kvsweep.frontier_limit`, for MLflow."""
        return self.capacity.tags() if self.capacity else {}

    @property
    def run_tags(self) -> dict[str, dict[str, str]]:
        """`quality_tags`, `frontier_tags` and the compile paybacks merged per cell: every tag this report writes
        on cell runs."""
        merged = {cid: dict(tags) for cid, tags in self.quality_tags.items()}
        for found in (self.frontier_tags, self.found_tags):
            for cid, tags in found.items():
                merged.setdefault(cid, {}).update(tags)
        return merged

    @property
    def run_metrics(self) -> dict[str, dict[str, float]]:
        """Cell id -> the metrics only a report across cells can work out (a workload cell's token agreement with
        its mix's dynamic cell, a compiled one's `compile_payback_requests`), for the cells' MLflow runs."""
        return self.found_metrics


def settings_from(values: dict[str, Any]) -> Settings:
    """From the config's `report` section or the parent run's `report.*` params (strings)."""
    return Settings.from_values(values)


def write_report(results: list[CellResult], folder: Path, context: ReportContext) -> Report:
    folder.mkdir(parents=True, exist_ok=True)
    found = fill_agreement(results)  # a workload cell's tokens against its dynamic cell's, when the samples are at hand
    payback_metrics, payback_tags = payback_findings(workload_groups(results).values())
    for cid, metrics in [*payback_metrics.items(), *fill_paired_ratios(workload_groups(results).values()).items()]:
        found.setdefault(cid, {}).update(metrics)
    decisions = decide(results, context.settings)
    (folder / PARETO_CSV).write_text(pareto_csv(decisions))
    listing = list_decisions(decisions, results)
    probes = context.capacity is not None  # a search's lone probes make figures of one line: left out
    shaped = [r for r in results if not r.cell.is_workload]  # a workload's figures are its CDFs (workload_report)
    plots = draw_facets(shaped, folder / "plots", max_kl=context.settings.max_kl, min_strategies=2 if probes else 1)
    capacity = section = None
    if context.capacity is not None:
        capacity = assess(results, context.capacity, context.settings)
        section = capacity_section(capacity)
        (folder / CAPACITY_CSV).write_text(capacity_csv(capacity))
        plots = [*draw_capacity(capacity, colours(results), folder / "plots"), *plots]
    if (forecast := draw_forecast(results, colours(results), folder / "plots")) is not None:
        plots = [*plots, forecast]
    weights_kv = weights_kv_tables(shaped)
    workloads = workload_section(results, folder / "plots", context.links)  # None without workload cells
    settings = context.settings  # saturation.csv and the load-level tables, with workload.rate's cells
    workloads = with_load_levels(workloads, results, folder, settings.slo_ttft_ms, settings.slo_tpot_ms)
    (folder / "selection.md").write_text(
        selection_markdown(context.title, decisions, context.links, listing, section, weights_kv, workloads)
    )
    page = render_page(
        context.title,
        intro(decisions),
        decisions,
        plots,
        context.links,
        context.parent_url,
        listing,
        section,
        weights_kv,
        workloads,
    )
    (folder / "report.html").write_text(page)
    report = Report(folder, decisions, plots, capacity, listing, workloads, found, payback_tags)
    report.load = load_lines(results)
    return report


def write_tables(results: list[CellResult], folder: Path) -> str:
    """`results.csv` and `results.txt` (the terminal table, returned): once per sweep, in its run folder."""
    folder.mkdir(parents=True, exist_ok=True)
    table = results_table(results)
    (folder / "results.csv").write_text(results_csv(results))
    (folder / "results.txt").write_text(table)
    return table


def write_results_json(
    folder: Path, results: list[CellResult], decisions: list[Decision], params: dict[str, Any]
) -> None:
    """`results.json` (the sweep's params, every cell, the selection) beside `results.csv`, for scripts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESULTS_JSON).write_text(results_json(results, decisions, params))
