"""Where a sweep's results go: the journal first (on disk before MLflow sees a result), then the MLflow sink
with its parent run, resumed or new, held under a lease while the sweep runs.

Which parent is "the same sweep": its key, which carries `grid.PROTOCOL_VERSION`. A resumed sweep adopts
the latest parent with its key and measures only the cells it lacks. A release that changes what a cell
id hashes or what a cell reports bumps the version, so it starts a parent of its own, measures every cell
again and says which parent it left and why: old numbers never sit beside new ones under one parent.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvsweep.config.schema import KvSweepConfig
from kvsweep.grid import PROTOCOL_VERSION
from kvsweep.model_names import display_names
from kvsweep.redact import redact_uri
from kvsweep.results import CellResult
from kvsweep.tracking.journal import Journal, SweepHeader

REVISION_CHANGES = {
    2: (
        "decode bytes of quantized weights counted as stored, split cells metered and capped on every GPU, "
        "bnb-nf4 computing in the cell's dtype, offloaded caches' device bytes predicted when generate returns"
    ),
    3: "cell ids hash the whole measure protocol (every measure key, wait_for_idle_gpu_s included)",
}
KEYED = ("name", "grid", "measure", "inputs", "search", "slo", "device", "trust_remote_code")


def sweep_key(cfg: KvSweepConfig, revision: int = PROTOCOL_VERSION) -> str:
    """Identity of "the same sweep" for resume: what is measured, how it is counted (`revision`) and where it is
    logged, not how it is run (Ray's keys, the planner's, the report's)."""
    if revision < 3:
        return _key_before_3(cfg, revision)
    whole = asdict(cfg)
    identity = {key: whole[key] for key in KEYED} | {"experiment": cfg.mlflow.experiment, "version": revision}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _key_before_3(cfg: KvSweepConfig, revision: int) -> str:
    """The key releases before version 3 gave a sweep, kept only to find (and name) a parent they left: their
    inputs', search's and SLO's keys, and the measure keys added later, counted only where not the default."""
    whole, defaults = asdict(cfg), asdict(KvSweepConfig())
    identity = {k: whole[k] for k in ("name", "grid", "measure", "device", "trust_remote_code")}
    identity["experiment"] = cfg.mlflow.experiment
    for key in ("search", "slo", "inputs"):
        if whole[key] != defaults[key]:
            identity[key] = whole[key]
    later = ("quality_trials", "device_memory_limit_gb")
    identity["measure"] = {k: v for k, v in whole["measure"].items() if k not in later or v != defaults["measure"][k]}
    if revision > 1:
        identity["measurement_revision"] = revision
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def earlier_revisions(cfg: KvSweepConfig) -> list[tuple[int, str]]:
    """Each earlier version with this sweep's key under it, newest first."""
    return [(r, sweep_key(cfg, r)) for r in range(PROTOCOL_VERSION - 1, 0, -1)]


def left_parent_note(revision: int, parent_run_id: str) -> str:
    """The first lines' account of an older parent this sweep does not resume."""
    changes = "; ".join(REVISION_CHANGES[r] for r in range(revision + 1, PROTOCOL_VERSION + 1))
    return (
        f"parent run {parent_run_id} holds this sweep measured by an earlier kvsweep (measurement revision "
        f"{revision}); its numbers are not mixed with this version's ({changes}): every cell is measured again "
        "under a new parent, and the old one is left as it is"
    )


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
    tracker = SweepTracker(uri, header.experiment, seams.mlflow_faults)
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
