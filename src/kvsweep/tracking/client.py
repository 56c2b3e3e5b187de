"""MLflow operations of the driver (the only writer): one parent run per sweep, one child run per cell.

Names follow DESIGN.md's contract so MLflow's chart and compare views work without cleanup:
axes as params, numbers as metrics, status and identity as tags. Every method may raise when MLflow
is unreachable; `sink.py` decides what to do about it.
"""

import math
import os
import time
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag

from kvsweep.model_names import short_name
from kvsweep.redact import redact_text, redact_uri
from kvsweep.results import CellResult
from kvsweep.tracking.names import (
    CARRIED_TAGS,
    ENV_TAG_PREFIX,
    INT_PARAMS,
    PARAM_KEYS,
    PARENT_ID_TAG,
    REPORT_DIR,
    RUN_NAME_TAG,
    SWEEP_KEY_TAG,
    SWEEP_TAG,
)
from kvsweep.tracking.view import compare_view_query, group_keys_from_config, save_compare_view

# MLflow's own HTTP retries can stall a sweep for minutes when the server is down; kvsweep retries
# itself with backoff and keeps results in its journal meanwhile. Users can still override these.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}


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


def compare_url(tracking_uri: str, experiment_id: str, parent_run_id: str) -> str:
    """The sweep's saved view: cells grouped by cache, metrics charted against context length."""
    return runs_url(tracking_uri, experiment_id) + compare_view_query(parent_run_id)


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """One run's page in the MLflow UI (for a local store: the `mlflow ui` default address)."""
    return runs_url(tracking_uri, experiment_id).removesuffix("/runs") + f"/runs/{run_id}"


class SweepTracker:
    def __init__(self, tracking_uri: str, experiment: str) -> None:
        # MLflow prints a "View run" link per run with the URI as given, credentials included;
        # kvsweep prints its own, redacted, link instead.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self._experiment_id = ""

    @property
    def experiment_id(self) -> str:
        """Looked up (or created) on first use, so a tracker can exist while MLflow is down."""
        if not self._experiment_id:
            found = self.client.get_experiment_by_name(self.experiment)
            self._experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        return self._experiment_id

    # -- the sweep's parent run
    def find_sweep(self, sweep_key: str) -> str | None:
        """The latest parent run of this exact sweep (same config and experiment), to resume."""
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.`kvsweep.role` = 'sweep' and tags.`{SWEEP_KEY_TAG}` = '{sweep_key}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def start_sweep(self, name: str, sweep_key: str, params: dict[str, Any], config_yaml: str) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={"kvsweep.role": "sweep", SWEEP_TAG: name, SWEEP_KEY_TAG: sweep_key},
        )
        self.client.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
        self.client.log_text(run.info.run_id, config_yaml, "config.yaml")
        self.save_compare_view(run.info.run_id, name, group_keys_from_config(config_yaml))
        return run.info.run_id

    def reopen_sweep(self, parent_run_id: str) -> None:
        self.client.update_run(parent_run_id, status="RUNNING")

    def log_sweep_files(self, parent_run_id: str, files: dict[str, str], tags: dict[str, str]) -> None:
        if tags:
            self.client.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        for name, text in files.items():
            self.client.log_text(parent_run_id, text, name)

    def log_report(self, parent_run_id: str, folder: Path) -> None:
        """The report folder as the parent run's `report/` artifacts (HTML, Markdown, plots)."""
        if folder.is_dir():
            self.client.log_artifacts(parent_run_id, str(folder), REPORT_DIR)

    def save_compare_view(self, parent_run_id: str, sweep: str, groups: list[str]) -> None:
        """The sweep's saved chart view in the UI, one line per configuration (see view.py)."""
        save_compare_view(self.client, self.experiment_id, parent_run_id, sweep, groups)

    def finish_sweep(self, parent_run_id: str, counts: dict[str, int], status: str) -> None:
        now = _now_ms()
        self.client.log_batch(
            parent_run_id,
            metrics=[Metric(f"cells_{k}", float(v), now, 0) for k, v in counts.items()],
            tags=[RunTag("kvsweep.counts", " ".join(f"{k}={v}" for k, v in counts.items() if v))],
        )
        self.client.set_terminated(parent_run_id, status)

    # -- the cells' child runs
    def child_runs(self, parent_run_id: str) -> dict[str, Run]:
        """Child runs by cell id (the latest one where, against the contract, there are several)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.`{PARENT_ID_TAG}` = '{parent_run_id}'",
            max_results=50000,
            order_by=["attributes.start_time ASC"],
        )
        return {r.data.tags.get("kvsweep.cell_id", r.info.run_id): r for r in runs}

    def open_cell(
        self, parent_run_id: str, cell_id: str, cell: dict[str, Any], device: str, sweep: str, model_name: str = ""
    ) -> str:
        """A RUNNING child run with the cell's identity and params, so the UI shows what is in flight.

        Its name shows the model's display name; the `model` param keeps the full reference.
        """
        tags = {
            PARENT_ID_TAG: parent_run_id,
            RUN_NAME_TAG: cell_run_name(cell, model_name),
            "kvsweep.role": "cell",
            SWEEP_TAG: sweep,
            "kvsweep.cell_id": cell_id,
        }
        tags = {k: redact_text(v) for k, v in tags.items()}
        run = self.client.create_run(self.experiment_id, run_name=tags[RUN_NAME_TAG], tags=tags)
        params = [Param(k, redact_text(str(cell[k]).lower() if k == "compile" else str(cell[k]))) for k in PARAM_KEYS]
        params.append(Param("device", device))
        self.client.log_batch(run.info.run_id, params=params)
        return run.info.run_id

    def finish_cell(self, run_id: str, result: CellResult, device: str, extra_tags: dict[str, str]) -> None:
        tags = {
            "kvsweep.status": result.status,
            "kvsweep.attempt": str(result.attempt),
            "kvsweep.device_name": str(result.environment.get("device_name", device)),
            **{f"{ENV_TAG_PREFIX}{k}": str(v) for k, v in result.environment.items() if k != "device_name"},
            **result.tags,
            **extra_tags,
        }
        if result.error:
            tags["kvsweep.error"] = result.error[:5000]
        now = _now_ms()
        metrics = [Metric(k, float(v), now, 0) for k, v in result.metrics.items() if v is not None and math.isfinite(v)]
        metrics.append(Metric("cell_wall_s", result.wall_s, now, 0))
        # The axes again as metrics: MLflow's line charts take only a metric as their x axis.
        metrics += [Metric(k, float(result.cell[k]), now, 0) for k in INT_PARAMS]
        self.client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, redact_text(v)) for k, v in tags.items()])
        if result.samples:
            self.client.log_dict(run_id, {"samples": result.samples, "environment": result.environment}, "samples.json")
        if result.traceback:
            self.client.log_text(run_id, result.traceback, "traceback.txt")
        self.client.set_terminated(run_id, mlflow_status(result.status))

    def kill_cell(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "KILLED")


def mlflow_status(status: str) -> str:
    # ok/skipped/oom are results, not failures; MLflow's FAILED is kept for error, timeout, crash.
    return "FINISHED" if status in ("ok", "skipped", "oom") else "FAILED"


def cell_run_name(cell: dict[str, Any], model_name: str = "") -> str:
    """`static+compile ctx64 bs1 float32 local-llama`: the model by display name (model_names.py)."""
    compiled = "+compile" if cell.get("compile") else ""
    model = model_name or short_name(cell["model"])
    return f"{cell['cache']}{compiled} ctx{cell['context_length']} bs{cell['batch_size']} {cell['dtype']} {model}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def result_from_run(run: Run) -> CellResult:
    """A child run read back as a result (metrics and status; samples stay in its artifact)."""
    params, tags = run.data.params, run.data.tags
    cell = {f: params.get(f, "") for f in PARAM_KEYS}
    for key in INT_PARAMS:
        cell[key] = int(cell[key])
    cell["compile"] = cell["compile"] == "true"
    return CellResult(
        tags.get("kvsweep.cell_id", ""),
        cell,
        tags.get("kvsweep.status", "?"),
        error=tags.get("kvsweep.error", ""),
        metrics={k: v for k, v in run.data.metrics.items() if k not in INT_PARAMS},
        attempt=int(tags.get("kvsweep.attempt", "1")),
        tags={k: tags[k] for k in CARRIED_TAGS if k in tags},
        environment={
            "device_name": tags.get("kvsweep.device_name", ""),
            **{k.removeprefix(ENV_TAG_PREFIX): v for k, v in tags.items() if k.startswith(ENV_TAG_PREFIX)},
            "mlflow_run_id": run.info.run_id,
        },
    )
