"""The variables Ray's and MLflow's own tools read, honoured as those tools honour them, and shown resolved.

A user on a cluster has `RAY_ADDRESS`, `MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_NAME` set already (a Ray job's
entrypoint gets `RAY_ADDRESS` from Ray itself). A key given in the config wins, as a value set in code wins over
the variable in those tools; a key left at its default takes the variable. Composition writes what it resolved into
the config, so `--cfg job`, the saved config and every stage see the address and store actually used.

- `ray.address`: empty takes `RAY_ADDRESS` (as `ray.init()` does); `local` starts a local instance whatever
  is set (Ray's own word for it); with neither, a local instance.
- `mlflow.tracking_uri`: empty takes `MLFLOW_TRACKING_URI`, else `sqlite:///<cwd>/mlflow.db`; a sqlite path is
  made absolute here (Ray's workers change directory, and a relative path would name another file).
- `mlflow.experiment`: the default `kvsweep` gives way to `MLFLOW_EXPERIMENT_NAME`.
"""

import os
import re
from collections.abc import Mapping
from pathlib import Path

from kvsweep.config.schema import DEFAULT_EXPERIMENT
from kvsweep.errors import ConfigError

RAY_ADDRESS_ENV = "RAY_ADDRESS"
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
MLFLOW_SECTION = "mlflow"  # the config section of the two MLflow keys (not an MLflow tag: see names.py)
LOCAL_RAY = "local"  # `ray.address=local`: a fresh local instance even where RAY_ADDRESS is set
BARE_URIS = ("databricks", "databricks-uc", "uc")  # MLflow's tracking URIs without a colon
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def ray_address(configured: str, environ: Mapping[str, str] = os.environ) -> str:
    """The address `ray.init` is given: the config's, else `RAY_ADDRESS`, else empty (a local instance)."""
    return configured or environ.get(RAY_ADDRESS_ENV, "").strip()


def tracking_uri(configured: str, environ: Mapping[str, str] = os.environ, cwd: Path | None = None) -> str:
    """The config's URI, else MLFLOW_TRACKING_URI, else an sqlite file in the current folder; sqlite paths absolute.

    MLflow 3.13+ refuses its old file store, so a `file:` URI is refused here in one line rather than failing later
    inside MLflow; a bare path names an sqlite file."""
    given = configured or environ.get(TRACKING_URI_ENV, "").strip()
    here = cwd or Path.cwd()
    if not given:
        return f"sqlite:///{here / 'mlflow.db'}"
    origin = f"{MLFLOW_SECTION}.tracking_uri" if configured else TRACKING_URI_ENV
    if given.startswith("file:"):
        raise ConfigError(
            f"{origin}={given}: MLflow 3.13+ no longer opens a file store; use an sqlite file "
            "(sqlite:///PATH/mlflow.db, or a plain path ending in .db) or a tracking server (http://host:5000)"
        )
    if given.startswith("sqlite:///") and not given.startswith("sqlite:////"):
        return f"sqlite:///{(here / given.removeprefix('sqlite:///')).resolve()}"
    if _SCHEME.match(given) or given in BARE_URIS:  # a URI MLflow knows (http, postgresql, databricks...): as given
        return given
    return f"sqlite:///{(here / given).resolve()}"  # a bare path: an sqlite file


def experiment_name(configured: str, given_keys: list[str], environ: Mapping[str, str] = os.environ) -> str:
    """The experiment: the config's, unless it is the default nobody typed and MLFLOW_EXPERIMENT_NAME names one."""
    named = environ.get(EXPERIMENT_ENV, "").strip()
    if named and configured == DEFAULT_EXPERIMENT and f"{MLFLOW_SECTION}.experiment" not in given_keys:
        return named
    return configured


def default_experiment(environ: Mapping[str, str] = os.environ) -> str:
    """The experiment a command reads when none is given (`report`, `compare`): MLflow's variable, else kvsweep."""
    return environ.get(EXPERIMENT_ENV, "").strip() or DEFAULT_EXPERIMENT


def resolved_environment(node: Mapping, given_keys: list[str]) -> dict[str, dict[str, str]]:
    """The keys of the composed config that Ray's and MLflow's variables decide, resolved (see the module)."""
    ray, mlflow = node.get("ray") or {}, node.get("mlflow") or {}
    return {
        "ray": {"address": ray_address(str(ray.get("address") or ""))},
        "mlflow": {
            "tracking_uri": tracking_uri(str(mlflow.get("tracking_uri") or "")),
            "experiment": experiment_name(str(mlflow.get("experiment", DEFAULT_EXPERIMENT)), given_keys),
        },
    }


def ray_address_note(address: str, environ: Mapping[str, str] = os.environ) -> str:
    """What the first lines say about the cluster joined: where the address came from."""
    if not address or address == LOCAL_RAY:
        return ""
    source = f" (from {RAY_ADDRESS_ENV}; ray.address was empty)" if environ.get(RAY_ADDRESS_ENV) == address else ""
    return f"Ray: joining the cluster at {address}{source}"
