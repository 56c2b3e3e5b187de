"""Getting results into MLflow, shared by the live sweep and `kvsweep sync`.

`send_result` writes one cell result into its child run, reusing the run the cell already has
(a resumed or retried cell never gets a second child run). `sync_journal` replays a journal and
is idempotent: a cell whose child run already holds a status is left alone.
"""

from pathlib import Path

from mlflow.entities import Run

from kvsweep.config.schema import ReportConfig
from kvsweep.models.presets import shape_only_tags
from kvsweep.names import CAPACITY_CSV, REPORT_DIR, Metric, ResultTag, RunTag
from kvsweep.results import CellResult
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import Journal, SweepHeader
from kvsweep.tracking.store import sync_tracking_uri

SWEEP_FILES = ("plan.txt", "results.csv", "results.txt", CAPACITY_CSV)  # logged on the parent run from the run folder


def quality_tags(result: CellResult, sweep_params: dict) -> dict[str, str]:
    """`kvsweep.low_agreement=true` when the tokens agree with dynamic less than the sweep's threshold."""
    agreement = result.metrics.get(Metric.TOKEN_AGREEMENT)
    if agreement is None:
        return {}
    threshold = float(sweep_params.get("report.min_token_agreement", ReportConfig().min_token_agreement))
    return {ResultTag.LOW_AGREEMENT: str(agreement < threshold).lower()}


def send_result(
    tracker: SweepTracker, parent_run_id: str, cell_runs: dict[str, str], result: CellResult, header: SweepHeader
) -> None:
    run_id = cell_runs.get(result.cell_id)
    if run_id is None:
        model_name = header.model_names.get(result.cell.model, "")
        run_id = tracker.open_cell(parent_run_id, result.cell_id, result.cell, header.device, header.name, model_name)
        cell_runs[result.cell_id] = run_id
    tags = {**shape_only_tags(result.cell.model), **quality_tags(result, header.params)}
    tracker.finish_cell(run_id, result, header.device, tags)


def ensure_parent(tracker: SweepTracker, header: SweepHeader, known_parent: str | None) -> str:
    """The journal's parent run if MLflow has it, else this sweep's latest parent, else a new one."""
    if known_parent:
        try:
            tracker.client.get_run(known_parent)
            return known_parent
        except Exception:  # deleted, or another store: fall back to the sweep key
            pass
    found = tracker.find_sweep(header.sweep_key)
    return found or tracker.start_sweep(header.name, header.sweep_key, header.params, header.config_yaml)


def unsent(results: list[CellResult], children: dict[str, Run]) -> list[CellResult]:
    """Results whose cell has no child run holding a status yet (missing, RUNNING or KILLED)."""

    def recorded(cell_id: str) -> bool:
        run = children.get(cell_id)
        return run is not None and RunTag.STATUS in run.data.tags

    return [r for r in results if not recorded(r.cell_id)]


def sync_journal(journal_path: Path, tracking_uri: str | None = None) -> tuple[int, int]:
    """Push a journal's results that MLflow lacks. Returns (sent, already there).

    Raises `CredentialsMissing` when the journal's URI lost its credentials and nothing supplies them.
    """
    run_dir = journal_path.parent
    contents = Journal(run_dir).read()
    if contents.header is None:
        raise ValueError(f"{journal_path} has no sweep header; not a kvsweep journal")
    header = contents.header
    tracker = SweepTracker(sync_tracking_uri(header.tracking_uri, tracking_uri), header.experiment)
    parent = ensure_parent(tracker, header, contents.parent_run_id)
    children = tracker.child_runs(parent)
    results = contents.latest_results()
    todo = unsent(results, children)
    cell_runs = {cid: run.info.run_id for cid, run in children.items()}
    for result in todo:
        send_result(tracker, parent, cell_runs, result, header)
    if contents.end is not None and tracker.client.get_run(parent).info.status == "RUNNING":
        files = {name: (run_dir / name).read_text() for name in SWEEP_FILES if (run_dir / name).exists()}
        tracker.log_sweep_files(parent, files, {})
        tracker.log_report(parent, run_dir / REPORT_DIR)
        tracker.finish_sweep(parent, contents.end["counts"], contents.end["status"])
    return len(todo), len(results) - len(todo)
