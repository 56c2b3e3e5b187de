"""Local JSON-lines journal of finished cells, written before anything is sent to MLflow.

Plain JSON (never pickle), one result per line, appended and flushed as each cell finishes, so a
result is on disk even if MLflow or the driver fails right after.
"""

import json
from pathlib import Path

from kvsweep.results import CellResult

JOURNAL_NAME = "journal.jsonl"


class Journal:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / JOURNAL_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, result: CellResult) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(result.to_dict(), sort_keys=True) + "\n")
            handle.flush()

    def read(self) -> list[CellResult]:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [CellResult.from_dict(json.loads(line)) for line in lines if line.strip()]
