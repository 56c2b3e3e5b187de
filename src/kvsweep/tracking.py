"""The only writer to MLflow: one parent run per sweep, one child run per cell.

Names follow DESIGN.md's contract so MLflow's chart and compare views work without cleanup:
axes as params, numbers as metrics, status and identity as tags.
"""

import math
import os
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from kvsweep.redact import redact_uri
from kvsweep.results import OK, CellResult

PARENT_ID_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
PARAM_KEYS = ("model", "dtype", "context_length", "batch_size", "max_new_tokens", "cache", "compile")


def default_tracking_uri(configured: str) -> str:
    """Config, then MLFLOW_TRACKING_URI, then an absolute sqlite file in the current directory.

    Made absolute before Ray starts: a relative sqlite path would mean another file elsewhere.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        return f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    if "://" not in uri:  # a bare path
        return f"sqlite:///{Path(uri).resolve()}"
    return uri


def runs_url(tracking_uri: str, experiment_id: str) -> str:
    """Where a person sees the sweep's runs (the UI opens experiments elsewhere by default)."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{redact_uri(tracking_uri).rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs"


class SweepTracker:
    def __init__(self, tracking_uri: str, experiment: str) -> None:
        # MLflow prints a "View run" link per run with the URI as given, credentials included;
        # kvsweep prints its own, redacted, link instead.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.parent_run_id = ""

    def start_sweep(self, name: str, params: dict[str, Any], config_yaml: str, plan_text: str) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={"kvsweep.role": "sweep", "kvsweep.sweep": name},
        )
        self.parent_run_id = run.info.run_id
        self.client.log_batch(self.parent_run_id, params=[Param(k, str(v)) for k, v in params.items()])
        self.client.log_text(self.parent_run_id, config_yaml, "config.yaml")
        self.client.log_text(self.parent_run_id, plan_text, "plan.txt")
        return self.parent_run_id

    def log_cell(self, result: CellResult, sweep_name: str, device: str, extra_tags: dict[str, str]) -> str:
        cell = result.cell
        tags = {
            PARENT_ID_TAG: self.parent_run_id,
            RUN_NAME_TAG: cell_run_name(cell),
            "kvsweep.role": "cell",
            "kvsweep.sweep": sweep_name,
            "kvsweep.cell_id": result.cell_id,
            "kvsweep.status": result.status,
            "kvsweep.attempt": str(result.attempt),
            "kvsweep.device_name": str(result.environment.get("device_name", device)),
            **{f"kvsweep.env.{k}": str(v) for k, v in result.environment.items() if k != "device_name"},
            **extra_tags,
        }
        if result.error:
            tags["kvsweep.error"] = result.error[:5000]
        run = self.client.create_run(self.experiment_id, run_name=tags[RUN_NAME_TAG], tags=tags)
        run_id = run.info.run_id
        params = [Param(k, str(cell[k]).lower() if k == "compile" else str(cell[k])) for k in PARAM_KEYS]
        params.append(Param("device", device))
        now = _now_ms()
        metrics = [Metric(k, float(v), now, 0) for k, v in result.metrics.items() if v is not None and math.isfinite(v)]
        metrics.append(Metric("cell_wall_s", result.wall_s, now, 0))
        self.client.log_batch(run_id, metrics=metrics, params=params)
        if result.samples:
            self.client.log_dict(run_id, {"samples": result.samples, "environment": result.environment}, "samples.json")
        if result.traceback:
            self.client.log_text(run_id, result.traceback, "traceback.txt")
        self.client.set_terminated(run_id, "FINISHED" if result.status == OK else _terminal(result.status))
        return run_id

    def finish_sweep(self, counts: dict[str, int], results_csv: str, summary_text: str, status: str) -> None:
        now = _now_ms()
        self.client.log_batch(
            self.parent_run_id,
            metrics=[Metric(f"cells_{k}", float(v), now, 0) for k, v in counts.items()],
            tags=[RunTag("kvsweep.counts", " ".join(f"{k}={v}" for k, v in counts.items() if v))],
        )
        self.client.log_text(self.parent_run_id, results_csv, "results.csv")
        self.client.log_text(self.parent_run_id, summary_text, "results.txt")
        self.client.set_terminated(self.parent_run_id, status)


def cell_run_name(cell: dict[str, Any]) -> str:
    compiled = "+compile" if cell.get("compile") else ""
    return (
        f"{cell['cache']}{compiled} ctx{cell['context_length']} bs{cell['batch_size']} {cell['dtype']} {cell['model']}"
    )


def _terminal(status: str) -> str:
    # skipped/oom are results, not failures; MLflow's FAILED is kept for error, timeout, crash.
    return "FINISHED" if status in ("skipped", "oom") else "FAILED"


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
