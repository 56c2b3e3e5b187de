"""Credentials never reach disk or MLflow, and `sync` gets them the way MLflow users provide them.

A real `mlflow server --app-name basic-auth` on 127.0.0.1 (MLflow's own authentication: an admin
user bootstrapped from MLFLOW_AUTH_ADMIN_PASSWORD, users' requests checked by HTTP basic auth).
"""

from pathlib import Path

import pytest
from mlflow import MlflowClient

from conftest import cell_runs, free_port, start_mlflow_server, stop, sweep_in_process
from kvsweep.cli import main
from kvsweep.redact import redact_text
from kvsweep.tracking.journal import Journal
from kvsweep.tracking.store import CredentialsMissing, sync_tracking_uri

PASSWORD = "kv-Sweep-pw-7Qz3x9"  # the server's admin password, given only inside the tracking URI
ENV_SECRET = "hf_EnvSecretValue42"  # a secret environment variable's value
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """host:port of a basic-auth MLflow server whose only user is admin / PASSWORD."""
    tmp = tmp_path_factory.mktemp("auth-server")
    ini = tmp / "basic_auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{tmp / 'auth.db'}\nadmin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "kvsweep-test-csrf-key",
    }
    port = free_port()
    server = start_mlflow_server(tmp, port, ("--app-name", "basic-auth"), env)
    yield f"127.0.0.1:{port}"
    stop(server)


def _sweep(run_dir: Path, uri: str, *overrides: str, experiment: str = "kvsweep") -> tuple[int, str]:
    """A sweep in this process against `uri`; (exit code, everything it printed)."""
    run = sweep_in_process(run_dir, overrides, uri, experiment)
    return run.code, run.out + run.err


def _leaks(data: bytes) -> list[str]:
    return [name for name, secret in (("password", PASSWORD), ("env secret", ENV_SECRET)) if secret.encode() in data]


def _artifact_files(client: MlflowClient, run_id: str, folder: Path, path: str = "") -> list[Path]:
    files = []
    for item in client.list_artifacts(run_id, path or None):
        if item.is_dir:
            files += _artifact_files(client, run_id, folder, item.path)
        else:
            files.append(Path(client.download_artifacts(run_id, item.path, str(folder))))
    return files


def test_no_file_written_and_no_mlflow_artifact_holds_a_credential(
    ray_cluster, cell_template, auth_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    uri = f"http://admin:{PASSWORD}@{auth_server}"
    code, out = _sweep(
        run_dir,
        uri,
        f"grid.models=[tiny-llama,/models/{ENV_SECRET}/llama]",  # unresolvable: its name lands in errors
        "grid.caches=[dynamic,static]",
        "+testing.faults=[{match: {cache: static}, fault: error}]",  # a traceback artifact
    )
    assert code == 1, out  # the error cells; everything else reached MLflow
    assert not _leaks(out.encode()), out

    header = Journal(run_dir).read().header
    assert header.tracking_uri == f"http://***@{auth_server}"  # the address stays, for `sync`
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {str(p.relative_to(run_dir)) for p in written}
    expected = {".hydra/config.yaml", ".hydra/overrides.yaml", "journal.jsonl", "plan.txt", "results.csv"}
    assert expected | {"results.txt", "results.json", "report/report.html", "report/selection.md"} <= names, names
    leaks = {str(p.relative_to(run_dir)): _leaks(p.read_bytes()) for p in written}
    assert not {k: v for k, v in leaks.items() if v}

    client = MlflowClient(uri)  # the password in the URI authenticates, as it did for the sweep
    experiment = client.get_experiment_by_name("kvsweep")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 5  # parent + 4 cells
    downloaded = [f for run in runs for f in _artifact_files(client, run.info.run_id, tmp_path / run.info.run_id)]
    kinds = {f.name for f in downloaded}
    assert {"config.yaml", "plan.txt", "results.csv", "report.html", "samples.json", "traceback.txt"} <= kinds
    assert not [str(f) for f in downloaded if _leaks(f.read_bytes())]
    assert not [r.info.run_id for r in runs if _leaks(f"{r.data.params} {r.data.tags}".encode())]
    assert not _leaks(str(experiment.tags).encode())  # the saved chart view


@pytest.mark.heavy  # multi-process reliability: MLflow refusing a sweep, then sync
def test_sync_takes_credentials_from_mlflows_environment_variables(
    ray_cluster, cell_template, auth_server, tmp_path, monkeypatch, capsys
):
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    run_dir = tmp_path / "run"
    # The server refuses this password: every result stays in the journal.
    code, out = _sweep(run_dir, f"http://admin:not-the-password@{auth_server}", "grid.caches=[dynamic]", experiment="x")
    assert code == 0 and "MLflow is not answering" in out and f"python -m kvsweep sync {run_dir}" in out, out
    capsys.readouterr()

    assert main(["sync", str(run_dir)]) == 2  # the journal's URI has no password and nothing gives one
    said = capsys.readouterr().out.strip()
    assert len(said.splitlines()) == 1, said
    assert f"http://***@{auth_server}" in said and "MLFLOW_TRACKING_USERNAME" in said and "--tracking-uri" in said

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    assert main(["sync", str(run_dir)]) == 0
    assert "sent 1, already in MLflow 0" in capsys.readouterr().out
    parents, children = cell_runs(f"http://{auth_server}", "x")  # MLflow's client reads the same variables
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert [c.data.tags["kvsweep.status"] for c in children] == ["ok"]
    assert main(["sync", str(run_dir)]) == 0
    assert "sent 0, already in MLflow 1" in capsys.readouterr().out


def test_sync_uri_sources_in_order(monkeypatch):
    for name in (*CREDENTIAL_VARIABLES, "MLFLOW_TRACKING_AUTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.mlflow/credentials either
    assert sync_tracking_uri("http://***@h:5000", "http://u:p@other:1") == "http://u:p@other:1"  # given wins
    assert sync_tracking_uri("sqlite:////tmp/m.db", None) == "sqlite:////tmp/m.db"  # nothing was redacted
    with pytest.raises(CredentialsMissing, match="MLFLOW_TRACKING_PASSWORD"):
        sync_tracking_uri("http://***@h:5000/x", None)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "abc")
    assert sync_tracking_uri("http://***@h:5000/x", None) == "http://h:5000/x"
    with pytest.raises(CredentialsMissing, match="secret query parameters"):
        sync_tracking_uri("https://h/x?token=***", None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://user:pass@host:5000/x", "http://***@host:5000/x"),
        ("uri: https://tok3n@host/api", "uri: https://***@host/api"),
        ("'postgresql://u:p,w@db:5432/m'", "'postgresql://***@db:5432/m'"),
        ("https://h/a?x=1&access_token=abc&api_key=k9", "https://h/a?x=1&access_token=***&api_key=***"),
        ("https://s3/b?X-Amz-Signature=f00d&X-Amz-Date=1", "https://s3/b?X-Amz-Signature=***&X-Amz-Date=1"),
        # not secrets: a plain address, a sqlite path with an @, MLflow's view key, an email
        ("http://host:5000/#/r?viewStateShareKey=kvsweep-1", "http://host:5000/#/r?viewStateShareKey=kvsweep-1"),
        ("sqlite:////tmp/a@b/mlflow.db", "sqlite:////tmp/a@b/mlflow.db"),
        ("mail me@example.com", "mail me@example.com"),
        ("model /models/hf_EnvSecretValue42/x", "model /models/***/x"),
    ],
)
def test_redact_text(text, expected):
    assert redact_text(text, {"HF_TOKEN": ENV_SECRET}) == expected
