"""The MLflow store: opening it when it may not exist yet, the URI sync uses, reading a sweep back.

MLflow makes a fresh sqlite store's tables the first time a process opens it, with no lock: two processes doing so
at once (a sweep and `mlflow ui`, two sweeps in one folder) meet each other's half-made schema and one fails.
kvsweep's own processes take turns (a lock file per store in the temporary folder); one that collides with another
program waits and opens it again once the tables are made.

`kvsweep sync`: a journal holds its tracking URI redacted (`http://***@host:5000`; kvsweep never writes
credentials to disk), so sync takes them the way MLflow users already provide them (docs/reliability.md).

Reading back (`latest_sweep`, `child_runs`, `result_from_run`): the resuming sweep, a journal's delivery and
`python -m kvsweep report` read a parent and its cells as `CellResult`s, by the names in `kvsweep.names`.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Run

from kvsweep.grid import NO_WEIGHT_QUANTIZATION, Cell
from kvsweep.inputs.spec import RANDOM
from kvsweep.names import (
    CARRIED_TAGS,
    ENV_TAG_PREFIX,
    INT_PARAMS,
    PARAM_KEYS,
    SWEEP_ROLE,
    TASK_JSONL,
    Metric,
    RunTag,
    task_of_metric,
)
from kvsweep.redact import is_redacted, without_credentials
from kvsweep.results import CellResult

OPEN_ATTEMPTS = 6
OPEN_WAIT_S = 0.5  # times the attempt: 0.5 s, 1 s, ... 7.5 s in all, for another program's schema


def open_client(tracking_uri: str, attempts: int = OPEN_ATTEMPTS) -> MlflowClient:
    """A client of the store; for a sqlite file, one that has made (or found) every table.

    MLflow opens a sqlite store, and makes its tables, when the client is made; a server's store is
    opened on the first request (nothing to wait for here: the server made its tables once).
    """
    if not tracking_uri.startswith("sqlite:"):
        return MlflowClient(tracking_uri=tracking_uri)
    with _turn(tracking_uri):
        for attempt in range(1, attempts):
            try:
                return MlflowClient(tracking_uri=tracking_uri)
            except Exception:
                if not store_file(tracking_uri).exists():  # nothing made it: a real problem (a bad folder)
                    raise
                time.sleep(OPEN_WAIT_S * attempt)
        return MlflowClient(tracking_uri=tracking_uri)  # the last attempt: what it raises, the caller sees


def store_file(tracking_uri: str) -> Path:
    """The file of a `sqlite:///PATH` URI.

    A failure to open a store whose file exists is taken for another process's half-made schema: its symptoms
    are too many to match messages (a table or index already there or gone, a locked database, a schema version
    moved underneath), so kvsweep waits and opens it again; a real fault still surfaces, after the waits.
    """
    return Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])


@contextlib.contextmanager
def _turn(tracking_uri: str) -> Iterator[None]:
    """kvsweep's processes on this host open one store one at a time."""
    digest = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"kvsweep-store-{digest}.lock")
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class CredentialsMissing(ValueError):
    """The journal's URI lost its credentials and nothing supplies them."""


def mlflow_has_credentials() -> bool:
    """Whether MLflow's client will authenticate by itself (environment variables or its credentials file)."""
    from mlflow.utils.credentials import read_mlflow_creds

    creds = read_mlflow_creds()
    if creds.username and creds.password:
        return True
    return bool(os.environ.get("MLFLOW_TRACKING_TOKEN") or os.environ.get("MLFLOW_TRACKING_AUTH"))


def sync_tracking_uri(journaled: str, given: str | None) -> str:
    """`given` (--tracking-uri or MLFLOW_TRACKING_URI) wins; else the journal's URI, its credentials from MLflow's."""
    if given:
        return given
    if not is_redacted(journaled):
        return journaled
    address = without_credentials(journaled)
    full_uri = "pass the full URI with --tracking-uri or MLFLOW_TRACKING_URI"
    if is_redacted(address):
        raise CredentialsMissing(
            f"the journal's tracking URI {journaled} had secret query parameters, which kvsweep never writes "
            f"to disk; {full_uri}"
        )
    if not mlflow_has_credentials():
        raise CredentialsMissing(
            f"the journal's tracking URI {journaled} had credentials, which kvsweep never writes to disk, and "
            f"none are set: export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
            f"MLFLOW_TRACKING_TOKEN), or {full_uri}"
        )
    return address


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


def cell_results(
    client: MlflowClient, experiment_id: str, parent_run_id: str, trials: bool = False
) -> list[CellResult]:
    """Every finished cell of a sweep, as the results the report reads; `trials`: with each cell's task trials (one
    artifact read a cell that answered a task), for a report whose quality gate pairs them."""
    results = [
        result_from_run(run) for run in child_runs(client, experiment_id, parent_run_id).values() if finished(run)
    ]
    return [with_trials(client, result) for result in results] if trials else results


def with_trials(client: MlflowClient, result: CellResult) -> CellResult:
    """The result with its task trials read back from its `task.jsonl` artifact, where it answered a task: the
    quality gate pairs two caches' trials (McNemar), which a resumed sweep or a rebuilt report needs as much as a
    live one. A run without the artifact (logged before trials were kept) keeps none: its intervals decide."""
    if result.trials or not any(task_of_metric(key) for key in result.metrics):  # it answered no task
        return result
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = client.download_artifacts(str(result.environment["mlflow_run_id"]), TASK_JSONL, folder)
        except Exception:  # no such artifact: nothing to pair
            return result
        result.trials = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return result


def result_from_run(run: Run) -> CellResult:
    """A child run read back as a result (metrics and status; samples stay in its artifact)."""
    params, tags = run.data.params, run.data.tags
    fields: dict[str, Any] = {f: params.get(f, "") for f in PARAM_KEYS}
    for key in INT_PARAMS:
        fields[key] = int(fields[key])
    fields["compile"] = fields["compile"] == "true"
    fields["inputs"] = fields["inputs"] or RANDOM  # a run logged before cells had inputs was fed random ids
    fields["weights"] = fields["weights"] or NO_WEIGHT_QUANTIZATION  # logged before weights were an axis
    fields["rate"] = float(fields["rate"] or 0.0)  # a workload cell's offered rate; none on a fixed-shape cell
    return CellResult(
        tags.get(RunTag.CELL_ID, ""),
        Cell(**fields),
        tags.get(RunTag.STATUS, "?"),
        error=tags.get(RunTag.ERROR, ""),
        metrics={k: v for k, v in run.data.metrics.items() if k not in INT_PARAMS},
        wall_s=float(run.data.metrics.get(Metric.CELL_WALL_S, 0.0)),  # what a resume's forecast is refined by
        attempt=int(tags.get(RunTag.ATTEMPT, "1")),
        tags={k: tags[k] for k in CARRIED_TAGS if k in tags},
        environment={
            "device_name": tags.get(RunTag.DEVICE_NAME, ""),
            **{k.removeprefix(ENV_TAG_PREFIX): v for k, v in tags.items() if k.startswith(ENV_TAG_PREFIX)},
            "mlflow_run_id": run.info.run_id,
        },
    )
