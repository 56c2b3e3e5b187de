"""Opening the MLflow store a sweep writes to, when it may not exist yet.

MLflow makes a fresh sqlite store's tables the first time a process opens it, with no lock: two
processes doing so at once (a sweep and `mlflow ui`, two sweeps in one folder) run into each other's
half-made schema and one fails (`table experiments already exists`, `no such index`, an out-of-date
schema, ...). kvsweep's own processes take turns (a lock file per store in the temporary folder); one
that collides with another program waits and opens it again, once that program has made the tables.

Which tracking URI `kvsweep sync` uses, and where its credentials come from.

kvsweep never writes credentials to disk, so a journal holds its tracking URI redacted
(`http://***@host:5000`). Sync gets them the way MLflow users already provide them: a full URI
(`--tracking-uri`, `MLFLOW_TRACKING_URI`), or MLflow's own `MLFLOW_TRACKING_USERNAME` /
`MLFLOW_TRACKING_PASSWORD` (or `~/.mlflow/credentials`), `MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_AUTH`,
which MLflow's client sends with every request to the journal's address.
"""

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from mlflow import MlflowClient

from kvsweep.redact import is_redacted, without_credentials

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

    A failure to open a store whose file exists is taken for another process's half-made schema: its
    symptoms are many (a table or index that already exists or is already gone, a locked database, a
    schema version moved underneath, an ORM attribute missing), so kvsweep waits and opens it again
    rather than matching messages; a real fault of an existing file still surfaces, after the waits.
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
