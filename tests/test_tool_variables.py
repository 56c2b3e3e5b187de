"""Ray's and MLflow's own variables, honoured as their tools honour them, and shown resolved by `--cfg job`.

A user on a cluster has `RAY_ADDRESS`, `MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_NAME` set already. The expected
values below are those tools' documented rules: `ray.init()` joins `RAY_ADDRESS` when given no address; MLflow takes
the variables unless code sets a value; MLflow 3.13+ no longer opens a `file:` store.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsweep.config.tool_variables import experiment_name, tracking_uri

REPO = Path(__file__).resolve().parents[1]


def cfg_job(*overrides: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
    return subprocess.run(
        [sys.executable, "-m", "kvsweep", "--cfg", "job", *overrides],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=cwd,
    )


def section(text: str, name: str) -> dict[str, str]:
    lines = text.split(f"\n{name}:\n", 1)[1].split("\n")
    return dict(line.strip().split(": ", 1) for line in lines if line.startswith("  ") and ": " in line)


@pytest.mark.slow  # `python -m kvsweep` processes
def test_cfg_job_shows_the_address_store_and_experiment_the_sweep_will_use(tmp_path):
    env = {
        "RAY_ADDRESS": "10.0.0.7:6379",
        "MLFLOW_TRACKING_URI": "http://mlflow-host:5000",
        "MLFLOW_EXPERIMENT_NAME": "team-kv",
    }
    shown = cfg_job(env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert section(shown.stdout, "ray")["address"] == "10.0.0.7:6379"
    mlflow = section(shown.stdout, "mlflow")
    assert mlflow == {"tracking_uri": "http://mlflow-host:5000", "experiment": "team-kv"}

    given = cfg_job("ray.address=auto", "mlflow.experiment=mine", "mlflow.tracking_uri=x.db", env=env, cwd=tmp_path)
    assert section(given.stdout, "ray")["address"] == "auto"  # a key given wins, as code wins in Ray and MLflow
    assert section(given.stdout, "mlflow") == {"tracking_uri": f"sqlite:///{tmp_path / 'x.db'}", "experiment": "mine"}
    local = cfg_job("ray.address=local", env=env, cwd=tmp_path)
    assert section(local.stdout, "ray")["address"] == "local"

    bare = cfg_job(env={}, cwd=tmp_path)
    assert section(bare.stdout, "ray")["address"] == "''"  # a local instance
    here = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert section(bare.stdout, "mlflow") == {"tracking_uri": here, "experiment": "kvsweep"}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["config", "environment"])
def test_a_file_store_is_refused_in_one_line_naming_where_it_came_from(tmp_path, where):
    uri = f"file:{tmp_path}/mlruns"
    if where == "config":
        proc = cfg_job(f"mlflow.tracking_uri={uri}", env={}, cwd=tmp_path)
    else:
        proc = cfg_job(env={"MLFLOW_TRACKING_URI": uri}, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    named = "mlflow.tracking_uri" if where == "config" else "MLFLOW_TRACKING_URI"
    assert f"{named}={uri}" in line and "sqlite:///" in line
    assert not (tmp_path / "mlruns").exists()
    helped = subprocess.run(
        [sys.executable, "-m", "kvsweep", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
    )
    assert helped.returncode == 0 and "mlflow.tracking_uri" in helped.stdout  # --help still helps


def test_tracking_uri_rules_match_mlflows():
    here = Path("/work/run")
    assert tracking_uri("", {}, here) == "sqlite:////work/run/mlflow.db"
    assert tracking_uri("", {"MLFLOW_TRACKING_URI": "https://u:p@host/"}, here) == "https://u:p@host/"
    assert tracking_uri("sqlite:///db/m.db", {}, here) == "sqlite:////work/run/db/m.db"  # made absolute here
    assert tracking_uri("sqlite:////abs/m.db", {}, here) == "sqlite:////abs/m.db"
    assert tracking_uri("../m.db", {}, here) == "sqlite:////work/m.db"
    assert tracking_uri("databricks", {}, here) == "databricks"  # MLflow's word for a Databricks workspace
    assert tracking_uri("runs", {}, here) == "sqlite:////work/run/runs"  # any other bare word is a path
    assert tracking_uri("databricks-uc://profile", {}, here) == "databricks-uc://profile"
    assert tracking_uri("postgresql://db/mlflow", {"MLFLOW_TRACKING_URI": "http://other"}, here) == (
        "postgresql://db/mlflow"
    )


def test_the_default_experiment_gives_way_to_mlflows_variable_only_when_nobody_typed_one():
    env = {"MLFLOW_EXPERIMENT_NAME": "team"}
    assert experiment_name("kvsweep", [], env) == "team"
    assert experiment_name("kvsweep", ["mlflow.experiment"], env) == "kvsweep"  # typed on the command line
    assert experiment_name("from-a-sweep-file", [], env) == "from-a-sweep-file"
    assert experiment_name("kvsweep", [], {}) == "kvsweep"


def test_submit_script_hands_mlflows_variables_to_the_job_and_lets_ray_name_the_cluster(tmp_path):
    """`ray job submit` needs a job server; a `ray` on PATH that prints its arguments shows what the script asks
    of it: the job server from RAY_ADDRESS, MLflow's variables in the job's environment, no address of its own
    for kvsweep (Ray sets RAY_ADDRESS for the entrypoint, and kvsweep joins it)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / "ray").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "RAY_ADDRESS": "http://head:8265",
        "MLFLOW_TRACKING_URI": "http://mlflow-host:5000",
        "MLFLOW_EXPERIMENT_NAME": "team",
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts/submit_sweep.sh"), "+sweep=long_context"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.splitlines()
    assert args[:4] == ["job", "submit", "--address", "http://head:8265"]
    runtime = json.loads(args[args.index("--runtime-env-json") + 1])
    assert runtime["env_vars"]["MLFLOW_TRACKING_URI"] == "http://mlflow-host:5000"
    assert runtime["env_vars"]["MLFLOW_EXPERIMENT_NAME"] == "team"
    assert args[args.index("--") + 1 :] == ["python", "-m", "kvsweep", "+sweep=long_context"]
    missing = subprocess.run(
        ["bash", str(REPO / "scripts/submit_sweep.sh")],
        capture_output=True,
        text=True,
        env={k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"},
    )
    assert missing.returncode != 0 and "MLFLOW_TRACKING_URI" in missing.stderr
