"""Where things are: the tracking URI a sweep uses, and the MLflow UI pages a person opens."""

import os
from pathlib import Path

from kvsweep.redact import redact_uri
from kvsweep.tracking.view import compare_view_query


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
