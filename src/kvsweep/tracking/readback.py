"""Reading a sweep back from MLflow: its parent run, its cells, each cell as a `CellResult`.

The resuming sweep, the delivery of a journal and `python -m kvsweep report` all read through here,
with the same names the sweep wrote with (`kvsweep.names`).
"""

from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Run

from kvsweep.grid import NO_WEIGHT_QUANTIZATION, Cell
from kvsweep.inputs.spec import RANDOM
from kvsweep.names import CARRIED_TAGS, ENV_TAG_PREFIX, INT_PARAMS, PARAM_KEYS, SWEEP_ROLE, RunTag
from kvsweep.results import CellResult


def latest_sweep(client: MlflowClient, experiment_id: str, sweep_key: str = "") -> str | None:
    """The latest parent run in the experiment (of this exact sweep, when `sweep_key` is given)."""
    query = f"tags.`{RunTag.ROLE}` = '{SWEEP_ROLE}'"
    if sweep_key:
        query += f" and tags.`{RunTag.SWEEP_KEY}` = '{sweep_key}'"
    runs = client.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def sweep_parents(client: MlflowClient, experiment_id: str, name: str = "", newest: int = 1000) -> list[Run]:
    """The experiment's sweep parent runs, newest first (only the sweep called `name`, when given)."""
    query = f"tags.`{RunTag.ROLE}` = '{SWEEP_ROLE}'"
    if name:
        query += f" and tags.`{RunTag.SWEEP}` = '{name}'"  # a name holds no quote (the caller checks)
    return client.search_runs([experiment_id], query, order_by=["attributes.start_time DESC"], max_results=newest)


def child_runs(client: MlflowClient, experiment_id: str, parent_run_id: str) -> dict[str, Run]:
    """Cell runs by cell id (the latest one where, against the contract, there are several)."""
    runs = client.search_runs(
        [experiment_id],
        f"tags.`{RunTag.PARENT_ID}` = '{parent_run_id}'",
        max_results=50000,
        order_by=["attributes.start_time ASC"],
    )
    return {r.data.tags.get(RunTag.CELL_ID, r.info.run_id): r for r in runs}


def finished(run: Run) -> bool:
    """A cell run that ended with a status (an open one was interrupted, or is still running)."""
    return RunTag.STATUS in run.data.tags


def cell_results(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list[CellResult]:
    """Every finished cell of a sweep, as the results the report reads."""
    return [result_from_run(run) for run in child_runs(client, experiment_id, parent_run_id).values() if finished(run)]


def result_from_run(run: Run) -> CellResult:
    """A child run read back as a result (metrics and status; samples stay in its artifact)."""
    params, tags = run.data.params, run.data.tags
    fields: dict[str, Any] = {f: params.get(f, "") for f in PARAM_KEYS}
    for key in INT_PARAMS:
        fields[key] = int(fields[key])
    fields["compile"] = fields["compile"] == "true"
    fields["inputs"] = fields["inputs"] or RANDOM  # a run logged before cells had inputs was fed random ids
    fields["weights"] = fields["weights"] or NO_WEIGHT_QUANTIZATION  # logged before weights were an axis
    return CellResult(
        tags.get(RunTag.CELL_ID, ""),
        Cell(**fields),
        tags.get(RunTag.STATUS, "?"),
        error=tags.get(RunTag.ERROR, ""),
        metrics={k: v for k, v in run.data.metrics.items() if k not in INT_PARAMS},
        attempt=int(tags.get(RunTag.ATTEMPT, "1")),
        tags={k: tags[k] for k in CARRIED_TAGS if k in tags},
        environment={
            "device_name": tags.get(RunTag.DEVICE_NAME, ""),
            **{k.removeprefix(ENV_TAG_PREFIX): v for k, v in tags.items() if k.startswith(ENV_TAG_PREFIX)},
            "mlflow_run_id": run.info.run_id,
        },
    )
