"""Local JSON-lines journal of a sweep, written before anything is sent to MLflow.

Plain JSON (never pickle), appended and flushed line by line: a header (which sweep, where its results belong),
the parent run id once MLflow gave one, then one line per finished cell, so whatever MLflow missed can be pushed
later (`python -m kvsweep sync`). Every string is redacted on its way to disk (credentials: `store.py`).
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsweep.config.schema import ReportConfig
from kvsweep.models.presets import shape_only_tags
from kvsweep.names import CAPACITY_CSV, FORECAST_JSON, PARETO_CSV, REPORT_DIR, RESULTS_JSON, Metric, ResultTag, RunTag
from kvsweep.redact import redact_text
from kvsweep.results import CellResult

if TYPE_CHECKING:  # the journal is written by a driver that has not imported MLflow yet; delivering needs it
    from mlflow.entities import Run

    from kvsweep.tracking.client import SweepTracker

JOURNAL_NAME = "journal.jsonl"


@dataclass
class SweepHeader:
    name: str
    sweep_key: str
    experiment: str
    tracking_uri: str
    device: str
    config_yaml: str
    params: dict[str, Any] = field(default_factory=dict)
    model_names: dict[str, str] = field(default_factory=dict)  # display names of the grid's models (run names)


@dataclass
class JournalContents:
    header: SweepHeader | None
    parent_run_id: str | None
    results: list[CellResult]
    end: dict[str, Any] | None = None  # {"status": ..., "counts": {...}} once the sweep ended
    parent_owner: str = ""  # the lease tag this sweep held its parent under ("" where it held none)

    def latest_results(self) -> list[CellResult]:
        """One result per cell: the last one written (a resumed cell may appear twice)."""
        return list({r.cell_id: r for r in self.results}.values())


class Journal:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / JOURNAL_NAME

    def _append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(_redacted(record), sort_keys=True) + "\n")
            handle.flush()

    def write_header(self, header: SweepHeader) -> None:
        self._append({"kind": "sweep", **asdict(header)})

    def write_parent(self, run_id: str, owner: str = "") -> None:
        """The parent this sweep writes to, and the lease tag it holds it under (`sync` finishes only its own)."""
        self._append({"kind": "parent", "run_id": run_id, "owner": owner})

    def write_end(self, status: str, counts: dict[str, int]) -> None:
        self._append({"kind": "end", "status": status, "counts": counts})

    def append(self, result: CellResult) -> None:
        self._append({"kind": "cell", "result": result.to_dict()})

    def read(self) -> JournalContents:
        header, parent, results, end, owner = None, None, [], None, ""
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill: everything before it still counts
                kind = record.pop("kind", None)
                if kind == "sweep" and header is None:
                    header = SweepHeader(**record)
                elif kind == "parent":
                    parent, owner = record["run_id"], record.get("owner", "")
                elif kind == "cell":
                    results.append(CellResult.from_dict(record["result"]))
                elif kind == "end":
                    end = record
        return JournalContents(header, parent, results, end, owner)


def _redacted(value: Any) -> Any:
    """The record with every string redacted (credentials in URIs, secret environment values)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {_redacted(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def find_journals(path: Path) -> list[Path]:
    """A run folder's journal, or every journal under a folder of runs."""
    path = Path(path)
    if path.is_file():
        return [path]
    if (path / JOURNAL_NAME).exists():
        return [path / JOURNAL_NAME]
    return sorted(path.rglob(JOURNAL_NAME))


# logged on the parent run from the run folder
SWEEP_FILES = ("plan.txt", FORECAST_JSON, "results.csv", "results.txt", RESULTS_JSON, CAPACITY_CSV, PARETO_CSV)


def quality_tags(result: CellResult, sweep_params: dict) -> dict[str, str]:
    """`kvsweep.low_agreement=true` when the tokens agree with dynamic less than the sweep's threshold."""
    agreement = result.metrics.get(Metric.TOKEN_AGREEMENT)
    if agreement is None:
        return {}
    threshold = float(sweep_params.get("report.min_token_agreement", ReportConfig().min_token_agreement))
    return {ResultTag.LOW_AGREEMENT: str(agreement < threshold).lower()}


def send_result(
    tracker: "SweepTracker", parent_run_id: str, cell_runs: dict[str, str], result: CellResult, header: SweepHeader
) -> bool:
    """The result onto its cell's child run (opened here if none is known); False, sending nothing, where the
    parent already holds a finished run of that cell that this sweep did not open (another sweep logged it)."""
    run_id = cell_runs.get(result.cell_id)
    if run_id is None:
        existing = tracker.cell_run(parent_run_id, result.cell_id)
        if existing is not None and RunTag.STATUS in existing.data.tags:
            cell_runs[result.cell_id] = existing.info.run_id
            return False
        model_name = header.model_names.get(result.cell.model, "")
        run_id = tracker.open_cell(parent_run_id, result.cell_id, result.cell, header.device, header.name, model_name)
        cell_runs[result.cell_id] = run_id
    tags = {**shape_only_tags(result.cell.model), **quality_tags(result, header.params)}
    tracker.finish_cell(run_id, result, header.device, tags)
    return True


def ensure_parent(tracker: "SweepTracker", header: SweepHeader, known_parent: str | None) -> str:
    """The journal's parent run if MLflow has it, else this sweep's latest parent, else a new one."""
    if known_parent:
        try:
            tracker.client.get_run(known_parent)
            return known_parent
        except Exception:  # deleted, or another store: fall back to the sweep key
            pass
    found = tracker.find_sweep(header.sweep_key)
    return found or tracker.start_sweep(header.name, header.sweep_key, header.params, header.config_yaml)


def unsent(results: list[CellResult], children: dict[str, "Run"]) -> list[CellResult]:
    """Results whose cell has no child run holding a status yet (missing, RUNNING or KILLED)."""

    def recorded(cell_id: str) -> bool:
        run = children.get(cell_id)
        return run is not None and RunTag.STATUS in run.data.tags

    return [r for r in results if not recorded(r.cell_id)]


def sync_journal(journal_path: Path, tracking_uri: str | None = None) -> tuple[int, int]:
    """Push a journal's results that MLflow lacks, and end its parent run if it ended and the parent is not another
    sweep's now (a lease held under another owner tag: the parent was resumed while this one was cut off). Returns
    (sent, already there).

    Raises `CredentialsMissing` when the journal's URI lost its credentials and nothing supplies them.
    """
    run_dir = journal_path.parent
    contents = Journal(run_dir).read()
    if contents.header is None:
        raise ValueError(f"{journal_path} has no sweep header; not a kvsweep journal")
    header = contents.header
    from kvsweep.tracking.client import SweepTracker
    from kvsweep.tracking.store import sync_tracking_uri

    tracker = SweepTracker(sync_tracking_uri(header.tracking_uri, tracking_uri), header.experiment)
    parent = ensure_parent(tracker, header, contents.parent_run_id)
    children = tracker.child_runs(parent)
    results = contents.latest_results()
    todo = unsent(results, children)
    cell_runs = {cid: run.info.run_id for cid, run in children.items()}
    for result in todo:
        send_result(tracker, parent, cell_runs, result, header)
    run = tracker.client.get_run(parent)
    holder = run.data.tags.get(RunTag.LEASE_OWNER, "")
    theirs = holder and holder != contents.parent_owner  # another sweep holds it now: not this journal's to end
    if contents.end is not None and run.info.status == "RUNNING" and not theirs:
        files = {name: (run_dir / name).read_text() for name in SWEEP_FILES if (run_dir / name).exists()}
        tracker.log_sweep_files(parent, files, {})
        tracker.log_report(parent, run_dir / REPORT_DIR)
        tracker.finish_sweep(parent, contents.end["counts"], contents.end["status"])
    return len(todo), len(results) - len(todo)
