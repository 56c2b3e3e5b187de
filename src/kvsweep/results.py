"""What a cell returns to the driver: plain data, JSON-able, never touching MLflow."""

from dataclasses import asdict, dataclass, field
from typing import Any

from kvsweep.grid import Cell

OK, OOM, SKIPPED, ERROR, TIMEOUT, CRASHED = "ok", "oom", "skipped", "error", "timeout", "crashed"
STATUSES = (OK, OOM, SKIPPED, ERROR, TIMEOUT, CRASHED)
# Statuses that count as a result for the exit code; the others make the sweep exit 1.
RESULT_STATUSES = frozenset({OK, OOM, SKIPPED})
# Statuses the driver retries in a fresh actor (the cell itself never said anything).
RETRIED_STATUSES = frozenset({CRASHED, TIMEOUT})


@dataclass
class CellResult:
    cell_id: str
    cell: Cell
    status: str
    error: str = ""  # short message when not ok
    metrics: dict[str, float] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)  # raw per-repeat values
    environment: dict[str, Any] = field(default_factory=dict)
    traceback: str = ""
    wall_s: float = 0.0  # whole cell, actor start to result, seen by the driver
    attempt: int = 1
    tags: dict[str, str] = field(default_factory=dict)  # extra MLflow tags (kvsweep.oom_kind, kvsweep.inferred)
    trials: list[dict[str, Any]] = field(default_factory=list)  # every task trial: the `task.jsonl` artifact

    def to_dict(self) -> dict[str, Any]:
        """Plain data for Ray and the journal (the cell becomes its fields)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CellResult":
        return cls(**{**data, "cell": Cell(**data["cell"])})
