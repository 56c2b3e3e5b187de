"""Two sweeps side by side: cells matched by their grid coordinates, a verdict per cell and metric.

Cells are matched by what was measured (model, dtype, context, batch, new tokens, cache, compile,
inputs), never by cell id: an id also hashes the measuring protocol, which may differ between the
two sweeps (the header says so when it does). A cell only one sweep has is `added` or `removed`; a
cell whose status changed gets one row saying so, and a change away from `ok` is a regression.

The first thing to read is what differs between the two sweeps: the environment from the cells' own
records (so a sweep that ran on two kinds of node shows both), the protocol from the parents' params.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvsweep.compare.judging import (
    ADDED,
    COMPARED,
    REGRESSIONS,
    REMOVED,
    STATUS_CHANGED,
    Thresholds,
    interval,
    judge,
    value,
)
from kvsweep.grid import CELL_FIELDS, Cell
from kvsweep.names import ResultTag
from kvsweep.results import OK, CellResult

ENVIRONMENT_FIELDS = (
    ("torch", "torch_version"),
    ("transformers", "transformers_version"),
    ("CUDA", "cuda_version"),
    ("driver", "driver_version"),
    ("device", "device_name"),
    ("kvsweep", "kvsweep_version"),
    ("node software", "node_software"),  # a hash of the node's packages and kvsweep's sources (software_survey.py)
    ("host", "hostname"),
    ("python", "python_version"),
)
PROTOCOL_PREFIXES = ("measure.", "inputs.")


@dataclass(frozen=True)
class Difference:
    what: str
    a: str
    b: str


def recorded(results: Iterable[CellResult], key: str) -> str:
    """Every value the cells recorded for one field, sorted and joined ("" when none did)."""
    return ", ".join(sorted({str(r.environment[key]) for r in results if r.environment.get(key) not in (None, "")}))


def environment_differences(a: list[CellResult], b: list[CellResult]) -> list[Difference]:
    found = [(label, recorded(a, key), recorded(b, key)) for label, key in ENVIRONMENT_FIELDS]
    return [Difference(label, x or "-", y or "-") for label, x, y in found if x != y]


def environment_same(a: list[CellResult], b: list[CellResult]) -> list[Difference]:
    """The fields both sweeps recorded alike (the header names them, so 'nothing differs' is checkable)."""
    found = [(label, recorded(a, key), recorded(b, key)) for label, key in ENVIRONMENT_FIELDS]
    return [Difference(label, x, y) for label, x, y in found if x == y and x]


def protocol_differences(a: Mapping[str, str], b: Mapping[str, str]) -> list[Difference]:
    keys = sorted(k for k in a.keys() | b.keys() if k.startswith(PROTOCOL_PREFIXES))
    return [Difference(k, a.get(k, "-"), b.get(k, "-")) for k in keys if a.get(k) != b.get(k)]


STATUS_METRIC, CELL_METRIC = "status", "cell"


@dataclass(frozen=True)
class SweepSide:
    """One of the two sweeps: its parent run and what it measured."""

    run_id: str
    name: str
    results: list[CellResult]
    params: Mapping[str, str] = field(default_factory=dict)  # the parent run's params (its config)
    url: str = ""


@dataclass(frozen=True)
class Row:
    """One cell and metric (or the cell's status, or the cell itself when only one sweep has it)."""

    cell: Cell
    metric: str
    a: float | str | None
    b: float | str | None
    verdict: str
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    threshold: float | None = None
    a_run: str = ""  # the cell's MLflow run in each sweep
    b_run: str = ""

    @property
    def regression(self) -> bool:
        return self.verdict in REGRESSIONS or (self.verdict == STATUS_CHANGED and self.a == OK)


@dataclass(frozen=True)
class Comparison:
    a: SweepSide
    b: SweepSide
    rows: list[Row]
    matched: int  # cells both sweeps have
    thresholds: Thresholds
    environment: list[Difference]
    protocol: list[Difference]

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regression]

    @property
    def exit_code(self) -> int:
        """0: nothing got worse; 1: a regression or a status change away from ok."""
        return 1 if self.regressions else 0


def compare_sweeps(a: SweepSide, b: SweepSide, thresholds: Thresholds) -> Comparison:
    mine, theirs = _by_cell(a.results), _by_cell(b.results)
    rows: list[Row] = []
    for cell in sorted(mine.keys() | theirs.keys(), key=_order):
        x, y = mine.get(cell), theirs.get(cell)
        if x is None or y is None:
            verdict = REMOVED if y is None else ADDED
            rows.append(Row(cell, CELL_METRIC, x and x.status, y and y.status, verdict, **_runs(x, y)))
        elif x.status != y.status:
            rows.append(Row(cell, STATUS_METRIC, x.status, y.status, STATUS_CHANGED, **_runs(x, y)))
        elif x.status == OK:
            rows.extend(_metric_rows(cell, x, y, thresholds))
    return Comparison(
        a,
        b,
        rows,
        len(mine.keys() & theirs.keys()),
        thresholds,
        environment_differences(a.results, b.results),
        protocol_differences(a.params, b.params),
    )


def _metric_rows(cell: Cell, x: CellResult, y: CellResult, thresholds: Thresholds) -> list[Row]:
    contended = any(r.tags.get(ResultTag.CONTENDED) == "true" for r in (x, y))
    rows = []
    for compared in COMPARED:
        va, vb = value(x.metrics, compared), value(y.metrics, compared)
        ia, ib = interval(x.metrics, compared), interval(y.metrics, compared)
        if va is None or vb is None or ia is None or ib is None:
            continue
        limit = thresholds.of(compared.name)
        judged = judge(compared, ia, ib, (va, vb), limit, contended)
        rows.append(
            Row(
                cell,
                compared.name,
                va,
                vb,
                judged.verdict,
                judged.ratio,
                judged.ratio_low,
                judged.ratio_high,
                limit,
                **_runs(x, y),
            )
        )
    return rows


def _by_cell(results: list[CellResult]) -> dict[Cell, CellResult]:
    return {r.cell: r for r in results}


def _runs(x: CellResult | None, y: CellResult | None) -> dict[str, str]:
    return {
        "a_run": x.environment.get("mlflow_run_id", "") if x else "",
        "b_run": y.environment.get("mlflow_run_id", "") if y else "",
    }


def _order(cell: Cell) -> tuple:
    return tuple(getattr(cell, f) for f in CELL_FIELDS)
