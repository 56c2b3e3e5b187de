"""`results.json`: the sweep for scripts and CI, in one file: its parameters, every cell and the selection.

`results.csv` is a table for people and spreadsheets; a script that gates a deploy on kvsweep's answer wants the
pick of each group, what refused the others and the numbers behind it without parsing text. Written beside
`results.csv` in the run folder and logged on the parent run with it; `python -m kvsweep report` writes it again.
Keys are MLflow's names (params, metrics, tags), so a script reads the same names it would query MLflow with.
"""

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from kvsweep.grid import CELL_FIELDS
from kvsweep.report.selection import Decision
from kvsweep.report.selection_entry import Entry
from kvsweep.results import CellResult

RESULTS_JSON_VERSION = 1  # bumped when a key changes meaning; new keys may appear without a bump


def results_json(results: Iterable[CellResult], decisions: Iterable[Decision], params: Mapping[str, Any]) -> str:
    """The document: `{"version", "sweep": params, "cells": [...], "selection": [...]}` (see the module)."""
    document = {
        "version": RESULTS_JSON_VERSION,
        "sweep": {key: _plain(value) for key, value in params.items()},
        "cells": [_cell(result) for result in results],
        "selection": [_group(decision) for decision in decisions],
    }
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def _cell(result: CellResult) -> dict[str, Any]:
    return {
        "cell_id": result.cell_id,
        **{name: _plain(getattr(result.cell, name)) for name in CELL_FIELDS},
        "status": result.status,
        "error": result.error,
        "metrics": {key: _number(value) for key, value in sorted(result.metrics.items())},
        "tags": dict(sorted(result.tags.items())),
    }


def _group(decision: Decision) -> dict[str, Any]:
    """One selection group: its axes, the pick and the leanest (cache labels or null), and each strategy's
    standing: eligible, held back and why, refused for quality and why."""
    model, dtype, batch, context, new, weights, workload, serving, rate = decision.key
    return {
        "group": decision.label,
        "model": model,
        "dtype": dtype,
        "batch_size": batch,
        "context_length": context,
        "max_new_tokens": new,
        "weights": weights,
        "workload": workload,
        "serving": serving,
        "rate": rate,
        "objective": decision.settings.objective,
        "ranked_by": decision.ranking.short,
        "memory_basis": decision.memory_basis,
        "pick": decision.pick.label if decision.pick else None,
        "leanest": decision.leanest.label if decision.leanest else None,
        "tied": [entry.label for entry in decision.tied],
        "tie_test": decision.tie_test,
        "summary": decision.summary(),
        "strategies": [_entry(entry) for entry in decision.entries],
    }


def _entry(entry: Entry) -> dict[str, Any]:
    return {
        "cache": entry.label,
        "cell_id": entry.result.cell_id,
        "status": entry.status,
        "ranked_ms": _number(entry.speed),
        "memory": _number(entry.memory),
        "vs_dynamic": {key: _number(value) for key, value in entry.deltas.items()},
        "eligible": entry.eligible,
        "held_back": list(entry.held_back),
        "refused": list(entry.gate.refusals) if entry.gate.refused else [],
        "contention": entry.contention,
    }


def _number(value: float | None) -> float | None:
    """JSON has no NaN or infinity: an unmeasured or unbounded number is null."""
    return None if value is None or not math.isfinite(value) else value


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)
