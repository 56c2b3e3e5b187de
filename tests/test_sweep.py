"""Whole sweeps through the real entry point: Hydra, Ray actors, MLflow, the results table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from conftest import cell_runs, statuses
from kvsweep import names
from kvsweep.cli import main
from kvsweep.tracking.journal import Journal

CELL_PARAMS = {
    *("model", "dtype", "context_length", "batch_size", "max_new_tokens", "cache", "compile", "device"),
    *("inputs", "inputs_sha256"),
}
CELL_METRICS = {
    "ttft_ms",
    "ttft_ms_p90",
    "tpot_ms",
    "tpot_ms_p90",
    "decode_tokens_per_s",
    "prefill_tokens_per_s",
    "e2e_ms",
    "first_call_ms",
    "kv_cache_bytes",
    "kv_cache_bytes_dense",
    "peak_host_rss_bytes",
    "token_agreement",
    "repeats",
    "predicted_peak_device_mem_bytes",
}


@pytest.mark.slow
def test_python_m_kvsweep_leaves_parent_and_child_runs(tmp_path):
    """The user's command in a fresh process: its own local Ray, the default sqlite store in cwd."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvsweep",
            "grid.dtypes=[float32]",
            "grid.context_lengths=[128]",
            "grid.max_new_tokens=[8]",
            "grid.caches=[dynamic,static,offloaded]",
            "measure.repeats=2",
            "measure.warmup=0",
            "hydra.run.dir=run",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "mlflow.db").exists()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parents, children = cell_runs(uri)
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    # the quickstart file's sweep with its grid changed on the command line: no longer the quickstart
    assert parent.info.status == "FINISHED" and parent.data.tags["kvsweep.sweep"] == "quickstart-custom"
    by_cache = {c.data.params["cache"]: c for c in children}
    for cache in ("dynamic", "static"):
        run = by_cache[cache]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["kvsweep.status"] == "ok"
        assert set(run.data.params) >= CELL_PARAMS
        assert set(run.data.metrics) >= CELL_METRICS
        assert run.data.params["context_length"] == "128" and run.data.params["device"] == "cpu"
        # The default preset: at least measure.repeats runs and 2 s of them, at most 30.
        assert 2 <= run.data.metrics["repeats"] <= 30
        # The forecast made before it ran, and what it took against it (docs/forecast.md)
        m = run.data.metrics
        assert m["forecast_s"] > 0 and m["forecast_ratio"] == pytest.approx(m["cell_wall_s"] / m["forecast_s"])
        samples = json.loads(
            Path(MlflowClient(uri).download_artifacts(run.info.run_id, "samples.json", str(tmp_path))).read_text()
        )
        assert len(samples["samples"]["repeats"]) == run.data.metrics["repeats"]  # raw samples behind the median
        assert samples["environment"]["torch_version"]
        assert samples["environment"]["niceness"] == 0  # normal priority; Ray's own default is nice 15
        # Everything logged is declared in the one vocabulary the report reads with (kvsweep.names).
        assert all(names.is_cell_metric(m) for m in run.data.metrics), set(run.data.metrics) - set(names.CELL_METRICS)
        declared_tags = {*names.CARRIED_TAGS, *vars(names.RunTag).values()}
        logged_tags = {
            t for t in run.data.tags if not t.startswith((names.ENV_TAG_PREFIX, "mlflow.user", "mlflow.source"))
        }
        assert logged_tags <= declared_tags, logged_tags - declared_tags
    skipped = by_cache["offloaded"]
    assert skipped.data.tags["kvsweep.status"] == "skipped" and "CUDA" in skipped.data.tags["kvsweep.error"]
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(parent.info.run_id)}
    assert {"config.yaml", "results.csv", "plan.txt"} <= artifacts
    assert "forecast: 2 cells" in (tmp_path / "run" / "plan.txt").read_text()  # offloaded: skipped on a CPU
    # forecast.json, a second reading of what each cell logged as its forecast, with the probe readings behind it
    stored = json.loads((tmp_path / "run" / "forecast.json").read_text())
    logged = {c.data.tags["kvsweep.cell_id"]: c.data.metrics.get("forecast_s") for c in by_cache.values()}
    assert {c["cell_id"]: c["seconds"] for c in stored["cells"]} == pytest.approx(
        {cid: seconds for cid, seconds in logged.items() if seconds is not None}
    )
    assert stored["rates"]["probes"]["flop_rates"]["float32"] > 1e9 and stored["rates"]["probes"]["bandwidth"] > 0
    assert "forecast.json" in artifacts
    assert "cells took" in proc.stdout and (tmp_path / "run" / "report" / "plots" / "forecast_ratio.png").is_file()
    assert "parent run" in proc.stdout and "mlflow ui --backend-store-uri" in proc.stdout
    assert "/#/experiments/" in proc.stdout
    assert (tmp_path / "run" / "results.csv").exists() and (tmp_path / "run" / ".hydra" / "config.yaml").exists()
    # results.json, for scripts: the same cells MLflow holds, the selection the terminal printed, the sweep's params
    assert "results.json" in artifacts
    document = json.loads((tmp_path / "run" / "results.json").read_text())
    assert {c["cell_id"]: c["status"] for c in document["cells"]} == {
        c.data.tags["kvsweep.cell_id"]: c.data.tags["kvsweep.status"] for c in children
    }
    by_id = {c.data.tags["kvsweep.cell_id"]: c for c in children}
    for cell in document["cells"]:
        assert cell["metrics"].get("tpot_ms") == by_id[cell["cell_id"]].data.metrics.get("tpot_ms")
    [group] = document["selection"]
    assert group["context_length"] == 128 and group["pick"] in {"dynamic", "static"}
    assert group["summary"] in proc.stdout  # the line the terminal printed
    strategies = {e["cache"]: e["status"] for e in group["strategies"]}
    assert strategies["dynamic"] == strategies["static"] == "ok" and strategies.get("offloaded", "skipped") == "skipped"
    assert document["sweep"]["name"] == "quickstart-custom" and document["sweep"]["measure.repeats"] == 2


def test_oom_skipped_and_bad_model_do_not_stop_the_sweep(run_sweep):
    run = run_sweep(
        "grid.models=[tiny-llama,no-such-preset-xyz]",
        "grid.caches=[dynamic,static,offloaded]",
        "+testing.faults=[{match: {cache: static}, fault: oom}]",
    )
    _, children = cell_runs(run.tracking_uri)
    status = statuses(run.tracking_uri, "model", "cache")
    assert status[("tiny-llama", "dynamic")] == "ok"
    assert status[("tiny-llama", "static")] == "oom"
    assert status[("tiny-llama", "offloaded")] == "skipped"
    assert {status[("no-such-preset-xyz", c)] for c in ("dynamic", "static", "offloaded")} == {"error"}
    errors = {c.data.tags.get("kvsweep.error", "") for c in children if c.data.params["model"] != "tiny-llama"}
    assert all("could not be resolved" in e for e in errors)
    assert run.code == 1  # an error cell makes the exit code 1; the rest were still logged
    assert "oom" in run.out and "ok" in run.out


def test_oom_alone_is_still_exit_0(run_sweep):
    run = run_sweep("grid.caches=[dynamic,static]", "+testing.faults=[{match: {cache: static}, fault: oom}]")
    assert run.code == 0
    _, children = cell_runs(run.tracking_uri)
    assert sorted(c.data.tags["kvsweep.status"] for c in children) == ["ok", "oom"]
    assert [c.data.tags.get("kvsweep.oom_kind") for c in children if c.data.params["cache"] == "static"] == ["device"]
    journaled = Journal(run.run_dir).read().results  # the local journal holds the same results as MLflow
    assert sorted(r.status for r in journaled) == ["ok", "oom"]
    assert {r.cell_id for r in journaled} == {c.data.tags["kvsweep.cell_id"] for c in children}


def test_dry_run_prints_plan_and_starts_nothing(tmp_path, capsys):
    code = main(
        [
            "+sweep=long_context",
            "dry_run=true",
            f"hydra.run.dir={tmp_path}/run",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    # the shipped sweep names a real checkpoint; with no Hub here it is planned from the preset of its shapes
    assert "ctx130944 bs4 bfloat16 Qwen/Qwen2.5-7B-Instruct-1M" in out and "quantized-hqq-int2" in out
    assert "the plan reads the bundled preset qwen2.5-7b's shapes" in out.splitlines()[1]
    assert "MiB" in out and not (tmp_path / "m.db").exists()
    assert "predicted oom" not in out  # no GPU size known here: nothing skipped on a guess
    assert main(["+sweep=long_context", "dry_run=true", "planner.device_memory_gb=40"]) == 0
    sized = capsys.readouterr().out
    line = next(
        line
        for line in sized.splitlines()
        if line.startswith("dynamic ctx130944 bs4 bfloat16 Qwen/Qwen2.5-7B-Instruct-1M new128")
    )
    assert "skip: predicted oom: needs" in line


def test_grid_needing_gpus_on_a_gpu_less_cluster_fails_at_once(run_sweep):
    run = run_sweep("device=cuda")
    assert run.code == 2
    assert "no GPUs" in run.err and len(run.err.strip().splitlines()) == 1


def test_sweep_logs_to_a_real_mlflow_server(ray_cluster, cell_template, mlflow_server, tmp_path, capsys):
    """An http:// tracking URI: a real `mlflow server` on 127.0.0.1, credentials redacted in output."""
    port = mlflow_server.rsplit(":", 1)[1]
    uri = f"http://user:s3cret@127.0.0.1:{port}"
    overrides = ["grid.caches=[dynamic]", f"mlflow.tracking_uri={uri}", "mlflow.experiment=real-server"]
    code = main([*_fast(), *overrides, f"hydra.run.dir={tmp_path}/r"])
    out = capsys.readouterr().out
    assert code == 0
    assert "s3cret" not in out and f"127.0.0.1:{port}/#/experiments/" in out
    _, children = cell_runs(mlflow_server, experiment="real-server")
    assert len(children) == 1 and children[0].data.tags["kvsweep.status"] == "ok"


def _fast():
    from conftest import FAST

    return FAST


@pytest.mark.heavy  # multi-process reliability: a hung cell's process killed at its timeout
def test_hung_cell_times_out_and_the_sweep_completes(run_sweep):
    """No retry: that a timed-out cell is retried once is the scheduler's own test (test_driver_parts)."""
    run = run_sweep(
        "grid.caches=[dynamic,static]",
        "ray.cell_timeout_s=8",
        "ray.max_retries=0",
        "+testing.faults=[{match: {cache: static}, fault: hang}]",
    )
    assert statuses(run.tracking_uri, "cache") == {"dynamic": "ok", "static": "timeout"}
    assert run.code == 1


@pytest.mark.heavy  # multi-process reliability: a crashed cell's process, retried
def test_crashed_cell_is_retried_and_logged_once(run_sweep):
    run = run_sweep("grid.caches=[dynamic]", "ray.max_retries=1", "+testing.faults=[{match: {}, fault: exit}]")
    _, children = cell_runs(run.tracking_uri)
    assert len(children) == 1
    assert children[0].data.tags["kvsweep.status"] == "crashed"
    assert children[0].data.tags["kvsweep.attempt"] == "2"
    assert run.code == 1
