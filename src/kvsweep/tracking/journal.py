"""Local JSON-lines journal of a sweep, written before anything is sent to MLflow.

Plain JSON (never pickle), appended and flushed line by line: a header saying which sweep this is
and where its results belong, the parent run id once MLflow gave one, then one line per finished
cell. Whatever MLflow missed can be pushed later from here (`python -m kvsweep sync`).
Every string is redacted on its way to disk: the header's tracking URI keeps its address but not
its credentials (sync gets those from MLflow's own variables, see `store.py`).
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvsweep.redact import redact_text
from kvsweep.results import CellResult

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

    def write_parent(self, run_id: str) -> None:
        self._append({"kind": "parent", "run_id": run_id})

    def write_end(self, status: str, counts: dict[str, int]) -> None:
        self._append({"kind": "end", "status": status, "counts": counts})

    def append(self, result: CellResult) -> None:
        self._append({"kind": "cell", "result": result.to_dict()})

    def read(self) -> JournalContents:
        header, parent, results, end = None, None, [], None
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
                    parent = record["run_id"]
                elif kind == "cell":
                    results.append(CellResult.from_dict(record["result"]))
                elif kind == "end":
                    end = record
        return JournalContents(header, parent, results, end)


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
