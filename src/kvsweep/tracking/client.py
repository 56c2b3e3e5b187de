"""MLflow operations of the driver (the only writer): one parent run per sweep, one child run per cell.

Names follow the contract in `names.py` so MLflow's chart and compare views work without cleanup:
axes as params, numbers as metrics, status and identity as tags. Every method may raise when MLflow
is unreachable; `sink.py` decides what to do about it.
"""

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from mlflow import entities
from mlflow.entities import Param, Run
from mlflow.exceptions import MlflowException

from kvsweep.grid import WORKLOAD_FIELDS, Cell, cell_label
from kvsweep.names import (
    CELL_ROLE,
    ENV_TAG_PREFIX,
    INPUTS_SHA256_PARAM,
    INT_PARAMS,
    NODE_PARAMS,
    PARAM_KEYS,
    REPORT_DIR,
    SWEEP_ROLE,
    TASK_JSONL,
    Metric,
    RunTag,
    sweep_count_metric,
)
from kvsweep.redact import redact_text
from kvsweep.results import RESULT_STATUSES, CellResult
from kvsweep.tracking.mlflow_ui import group_keys_from_config, save_compare_view
from kvsweep.tracking.store import child_runs, latest_sweep, open_client

# MLflow's own HTTP retries can stall a sweep for minutes when the server is down; kvsweep retries
# itself with backoff and keeps results in its journal meanwhile. Users can still override these.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}


class InjectedFailure(ConnectionError):
    """A tracker call failed on purpose (`+testing.mlflow_faults`), as a dropped request to MLflow would."""


class SweepTracker:
    def __init__(self, tracking_uri: str, experiment: str, faults: dict[str, int] | None = None) -> None:
        # MLflow prints a "View run" link per run with the URI as given, credentials included;
        # kvsweep prints its own, redacted, link instead.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        for key, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.client = open_client(tracking_uri)  # a fresh sqlite store gets its tables now (`store.py`)
        self._experiment_id = ""
        self._faults = dict(faults or {})  # test seam: call name -> failures left

    def _fail_if_injected(self, call: str) -> None:
        if self._faults.get(call, 0) > 0:
            self._faults[call] -= 1
            raise InjectedFailure(f"MLflow dropped the {call} request (injected by test)")

    @property
    def experiment_id(self) -> str:
        """Looked up (or created) on first use, so a tracker can exist while MLflow is down; another sweep
        may create the experiment at the same time."""
        if not self._experiment_id:
            self._experiment_id = self._find_or_create_experiment()
        return self._experiment_id

    def _find_or_create_experiment(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(self.experiment)
        except MlflowException:  # another sweep created it a moment ago
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    # -- the sweep's parent run
    def find_sweep(self, sweep_key: str) -> str | None:
        """The latest parent run of this exact sweep (same config and experiment), to resume."""
        return latest_sweep(self.client, self.experiment_id, sweep_key)

    def sweep_runs(self, sweep_key: str) -> list[Run]:
        """Every parent run of this exact sweep that is not deleted (rivals that started it at the same time)."""
        query = f"tags.`{RunTag.ROLE}` = '{SWEEP_ROLE}' and tags.`{RunTag.SWEEP_KEY}` = '{sweep_key}'"
        return self.client.search_runs([self.experiment_id], query, max_results=1000)

    def start_sweep(self, name: str, sweep_key: str, params: dict[str, Any], config_yaml: str) -> str:
        run_id = self.create_parent(name, sweep_key, {})
        self.describe_parent(run_id, name, params, config_yaml)
        return run_id

    def create_parent(self, name: str, sweep_key: str, tags: dict[str, str]) -> str:
        """The bare parent run, with its identity and `tags` (a lease) from its first instant."""
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={RunTag.ROLE: SWEEP_ROLE, RunTag.SWEEP: name, RunTag.SWEEP_KEY: sweep_key, **tags},
        )
        return run.info.run_id

    def describe_parent(self, run_id: str, name: str, params: dict[str, Any], config_yaml: str) -> None:
        """The parent's params, config and saved chart view: written once it is sure to be this sweep's parent."""
        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
        self.client.log_text(run_id, config_yaml, "config.yaml")
        self.save_compare_view(run_id, name, group_keys_from_config(config_yaml))

    def reopen_sweep(self, parent_run_id: str) -> None:
        self.client.update_run(parent_run_id, status="RUNNING")

    def log_sweep_files(self, parent_run_id: str, files: dict[str, str], tags: dict[str, str]) -> None:
        if tags:
            self.client.log_batch(parent_run_id, tags=[entities.RunTag(k, v) for k, v in tags.items()])
        for name, text in files.items():
            self.client.log_text(parent_run_id, text, name)

    def log_report(self, parent_run_id: str, folder: Path) -> None:
        """The report folder as the parent run's `report/` artifacts (HTML, Markdown, plots)."""
        if folder.is_dir():
            self.client.log_artifacts(parent_run_id, str(folder), REPORT_DIR)

    def save_compare_view(self, parent_run_id: str, sweep: str, groups: list[str]) -> None:
        """The sweep's saved chart view in the UI, one line per configuration (see `mlflow_ui.py`)."""
        save_compare_view(self.client, self.experiment_id, parent_run_id, sweep, groups)

    def tag_cells(
        self, tags_by_run: dict[str, dict[str, str]], metrics_by_run: dict[str, dict[str, float]] | None = None
    ) -> None:
        """Tags and metrics decided after the cells ran (the quality verdicts against dynamic, a workload cell's
        token agreement, a compile's payback), onto their child runs."""
        tag_runs(self.client, tags_by_run, metrics_by_run)

    def finish_sweep(self, parent_run_id: str, counts: dict[str, int], status: str) -> None:
        now = _now_ms()
        self.client.log_batch(
            parent_run_id,
            metrics=[entities.Metric(sweep_count_metric(k), float(v), now, 0) for k, v in counts.items()],
            tags=[entities.RunTag(RunTag.COUNTS, " ".join(f"{k}={v}" for k, v in counts.items() if v))],
        )
        self.client.set_terminated(parent_run_id, status)

    # -- the cells' child runs
    def child_runs(self, parent_run_id: str) -> dict[str, Run]:
        """Child runs by cell id (the latest one where, against the contract, there are several)."""
        self._fail_if_injected("child_runs")
        return child_runs(self.client, self.experiment_id, parent_run_id)

    def cell_run(self, parent_run_id: str, cell_id: str) -> Run | None:
        """The parent's child run of this cell, if one exists (the earliest, where against the contract several do)."""
        runs = self.client.search_runs(
            [self.experiment_id],
            f"tags.`{RunTag.PARENT_ID}` = '{parent_run_id}' and tags.`{RunTag.CELL_ID}` = '{cell_id}'",
            max_results=1,
            order_by=["attributes.start_time ASC"],
        )
        return runs[0] if runs else None

    def open_cell(
        self, parent_run_id: str, cell_id: str, cell: Cell, device: str, sweep: str, model_name: str = ""
    ) -> str:
        """A RUNNING child run with the cell's identity and params, so the UI shows what is in flight; the one the
        parent already has for this cell id if any (a parent holds one run per cell, whoever opened it).

        Its name shows the model's display name; the `model` param keeps the full reference.
        """
        existing = self.cell_run(parent_run_id, cell_id)
        if existing is not None:
            return existing.info.run_id
        tags = {
            RunTag.PARENT_ID: parent_run_id,
            RunTag.RUN_NAME: cell_label(cell, model_name),
            RunTag.ROLE: CELL_ROLE,
            RunTag.SWEEP: sweep,
            RunTag.CELL_ID: cell_id,
        }
        tags = {k: redact_text(v) for k, v in tags.items()}
        run = self.client.create_run(self.experiment_id, run_name=tags[RunTag.RUN_NAME], tags=tags)
        values = {k: getattr(cell, k) for k in PARAM_KEYS}
        params = [  # a workload cell's mix, serving mode and rate (0: closed loop); a fixed-shape cell has none
            Param(k, redact_text(_param_value(v)))
            for k, v in values.items()
            if cell.is_workload or k not in WORKLOAD_FIELDS
        ]
        params.append(Param("device", device))
        self.client.log_batch(run.info.run_id, params=params)
        return run.info.run_id

    def finish_cell(self, run_id: str, result: CellResult, device: str, extra_tags: dict[str, str]) -> None:
        tags = {
            RunTag.STATUS: result.status,
            RunTag.ATTEMPT: str(result.attempt),
            RunTag.DEVICE_NAME: str(result.environment.get("device_name", device)),
            **{f"{ENV_TAG_PREFIX}{k}": str(v) for k, v in result.environment.items() if k != "device_name"},
            **result.tags,
            **extra_tags,
        }
        if result.error:
            tags[RunTag.ERROR] = result.error[:5000]
        now = _now_ms()
        metrics = [
            entities.Metric(k, float(v), now, 0)
            for k, v in result.metrics.items()
            if v is not None and math.isfinite(v)
        ]
        metrics.append(entities.Metric(Metric.CELL_WALL_S, result.wall_s, now, 0))
        # The axes again as metrics: MLflow's line charts take only a metric as their x axis.
        metrics += [entities.Metric(k, float(getattr(result.cell, k)), now, 0) for k in INT_PARAMS]
        fed = result.environment.get(INPUTS_SHA256_PARAM)  # the prompts' hash, known once the cell has built them
        params = [Param(INPUTS_SHA256_PARAM, str(fed))] if fed else []
        params += [Param(k, str(result.environment[k])) for k in NODE_PARAMS if result.environment.get(k)]
        self.client.log_batch(
            run_id,
            metrics=metrics,
            params=params,
            tags=[entities.RunTag(k, redact_text(v)) for k, v in tags.items()],
        )
        if result.samples:
            self.client.log_dict(run_id, {"samples": result.samples, "environment": result.environment}, "samples.json")
        if result.trials:
            self.client.log_text(run_id, "".join(json.dumps(t) + "\n" for t in result.trials), TASK_JSONL)
        if result.traceback:
            self.client.log_text(run_id, result.traceback, "traceback.txt")
        self.client.set_terminated(run_id, mlflow_status(result.status))

    def kill_cell(self, run_id: str) -> None:
        self.client.set_terminated(run_id, "KILLED")


def mlflow_status(status: str) -> str:
    # ok/skipped/oom are results, not failures; MLflow's FAILED is kept for error, timeout, crash.
    return "FINISHED" if status in RESULT_STATUSES else "FAILED"


def _param_value(value: object) -> str:
    """Params as MLflow shows them: `compile` as `true`/`false` (read back by `store.result_from_run`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _now_ms() -> int:
    return int(time.time() * 1000)


def tag_runs(
    client: Any, tags_by_run: dict[str, dict[str, str]], metrics_by_run: dict[str, dict[str, float]] | None = None
) -> None:
    """Set each run's tags and log its metrics (an MlflowClient; one call a run)."""
    metrics_by_run = metrics_by_run or {}
    now = _now_ms()
    for run_id in dict.fromkeys([*tags_by_run, *metrics_by_run]):
        tags, metrics = tags_by_run.get(run_id) or {}, metrics_by_run.get(run_id) or {}
        if tags or metrics:
            client.log_batch(
                run_id,
                metrics=[entities.Metric(k, float(v), now, 0) for k, v in metrics.items()],
                tags=[entities.RunTag(k, v) for k, v in tags.items()],
            )
