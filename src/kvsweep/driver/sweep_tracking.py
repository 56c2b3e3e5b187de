"""Where a sweep's results go: the journal first (on disk before MLflow sees a result), then the MLflow sink
with its parent run, resumed or new, held under a lease while the sweep runs.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.sweep_identity import earlier_revisions, left_parent_note, sweep_key
from kvsweep.model_names import display_names
from kvsweep.redact import redact_uri
from kvsweep.results import CellResult
from kvsweep.tracking.journal import Journal, SweepHeader

if TYPE_CHECKING:
    from kvsweep.driver.job_sources import JobSource
    from kvsweep.testing.testing_config import Seams
    from kvsweep.tracking.client import SweepTracker
    from kvsweep.tracking.sink import MlflowSink


@dataclass(frozen=True)
class Tracking:
    """The journal, the MLflow sink, and the results MLflow already has (resumed, not run again)."""

    header: SweepHeader
    journal: Journal
    sink: "MlflowSink"
    done: dict[str, CellResult]  # by cell id
    uri: str  # the tracking URI, absolute


def open_tracking(
    cfg: KvSweepConfig,
    config_yaml: str,
    run_dir: Path,
    uri: str,
    device: str,
    source: "JobSource",
    seams: "Seams",
    say: Callable[[str], None],
) -> Tracking:
    """The journal's header, then the parent run (resumed unless `rerun=true`; a live twin sweep's lease is
    `LeaseHeld`), then the sweep's first line; a parent an older kvsweep measured under is named, not resumed."""
    from kvsweep.tracking.client import SweepTracker
    from kvsweep.tracking.lease import LeaseTimes
    from kvsweep.tracking.sink import MlflowSink

    params = {
        "name": cfg.name,
        "cells": len(source.cells),
        "device": device,
        "trust_remote_code": cfg.trust_remote_code,
        **{f"measure.{k}": v for k, v in asdict(cfg.measure).items()},
        **{f"report.{k}": v for k, v in asdict(cfg.report).items()},
        **{f"search.{k}": v for k, v in asdict(cfg.search).items()},
        **{f"slo.{k}": v for k, v in asdict(cfg.slo).items()},
        "ray.gpus_per_cell": cfg.ray.gpus_per_cell,
    }
    header = SweepHeader(
        cfg.name,
        sweep_key(cfg),
        cfg.mlflow.experiment,
        redact_uri(uri),  # on disk without credentials; `sync` gets them from MLflow's variables
        device,
        config_yaml,
        params,
        model_names=display_names(cfg.grid.models),
    )
    journal = Journal(run_dir)
    journal.write_header(header)
    tracker = SweepTracker(uri, header.experiment)
    sink = MlflowSink(tracker, journal, header, say, LeaseTimes(**seams.lease))
    done = sink.open(resume=not cfg.rerun)
    left = None if cfg.rerun or done or sink.down else older_parent(sink.tracker, cfg)
    say(
        f"sweep {cfg.name}: {source.describe()} on {device}; "
        f"trust_remote_code={cfg.trust_remote_code}; "
        f"MLflow {redact_uri(uri)} parent run {sink.parent_run_id or '(pending)'}"
    )
    if left is not None:
        say(left_parent_note(*left))
    return Tracking(header, journal, sink, done, uri)


def older_parent(tracker: "SweepTracker", cfg: KvSweepConfig) -> tuple[int, str] | None:
    """The parent an earlier kvsweep measured this sweep under (its revision and run id), not resumed: the first
    lines say so. None when there is none, or MLflow cannot say (the sink reports an MLflow problem itself)."""
    try:
        for revision, key in earlier_revisions(cfg):
            if (found := tracker.find_sweep(key)) is not None:
                return revision, found
    except Exception:  # only a note: an unreachable MLflow is the sink's to report
        return None
    return None


def log_parent_metric(tracking: Tracking, name: str, value: float, say: Callable[[str], None]) -> None:
    """A metric of the sweep's parent run, outside every cell (told, not fatal, when MLflow is down)."""
    from kvsweep.errors import first_line

    sink = tracking.sink
    try:
        if sink.parent_run_id is None:
            raise RuntimeError("no parent run yet")
        sink.tracker.client.log_metric(sink.parent_run_id, name, value)
    except Exception as exc:  # MLflow down: the sweep goes on without this one number
        say(f"{name}={value:.1f} not logged on the parent run ({first_line(exc)})")
