"""Which tracking URI `kvsweep sync` uses, and where its credentials come from.

kvsweep never writes credentials to disk, so a journal holds its tracking URI redacted
(`http://***@host:5000`). Sync gets them the way MLflow users already provide them: a full URI
(`--tracking-uri`, `MLFLOW_TRACKING_URI`), or MLflow's own `MLFLOW_TRACKING_USERNAME` /
`MLFLOW_TRACKING_PASSWORD` (or `~/.mlflow/credentials`), `MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_AUTH`,
which MLflow's client sends with every request to the journal's address.
"""

import os

from kvsweep.redact import is_redacted, without_credentials


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
