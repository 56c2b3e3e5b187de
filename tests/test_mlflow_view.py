"""The saved 'compare strategies' view groups cells so that each chart line is one configuration."""

import json

from mlflow import MlflowClient

from kvsweep.config.compose import compose_config
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.mlflow_ui import group_keys, group_keys_from_config


def test_every_varying_axis_but_the_x_axis_is_a_group_key():
    grid = {
        "models": ["tiny-llama"],
        "dtypes": ["float32", "bfloat16"],
        "context_lengths": [64, 128],  # the x axis: never a group
        "batch_sizes": [1, 1],  # one value, written twice: does not vary
        "max_new_tokens": [4, 8],
        "caches": ["dynamic"],  # always a group, even alone
        "compile": [False],
    }
    assert group_keys(grid) == ["cache", "dtype", "max_new_tokens"]
    assert group_keys({**grid, "compile": [False, True], "models": ["a", "b"]}) == [
        "cache",
        "model",
        "dtype",
        "max_new_tokens",
        "compile",
    ]


def test_the_view_saved_with_a_sweep_groups_by_its_varying_axes(tmp_path):
    """A real composed config (quickstart: two dtypes) and a real MLflow store; the view read back as the UI would."""
    composed = compose_config(["grid.batch_sizes=[1,4]"])
    assert group_keys_from_config(composed.yaml) == ["cache", "dtype", "batch_size"]
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "views")
    parent = tracker.start_sweep("quickstart", "key", {}, composed.yaml)
    tags = MlflowClient(tracker.tracking_uri).get_experiment(tracker.experiment_id).tags
    envelope = json.loads(tags[f"mlflow.sharedViewState.kvsweep-{parent}"])
    state = json.loads(envelope["state"])
    keys = [(k["mode"], k["groupByData"]) for k in state["groupBy"]["groupByKeys"]]
    assert keys == [("param", "cache"), ("param", "dtype"), ("param", "batch_size")]
    assert {c["selectedXAxisMetricKey"] for c in state["compareRunCharts"]} == {"context_length"}
    # Contention is visible in the view: its own chart, and the verdict beside the numbers in the table.
    assert "host_other_cpu_share" in {c["metricKey"] for c in state["compareRunCharts"]}
    assert {"tags.`kvsweep.contended`", "tags.`kvsweep.contention`", "metrics.`tpot_ms_ci_low`"} <= set(
        state["selectedColumns"]
    )


def test_a_workload_sweeps_view_groups_by_serving_mode_and_batch_not_by_the_replaced_axes():
    """The mix replaces context and new tokens (whatever the grid still says), and sequential cells are B = 1
    beside batched ones of B = 4: one line per cache, serving mode and B."""
    config = (
        "grid: {caches: [dynamic, paged], context_lengths: [256, 1024], max_new_tokens: [32], batch_sizes: [4]}\n"
        "workload: {source: lengths, serving: [sequential, continuous]}\n"
    )
    assert group_keys_from_config(config) == ["cache", "serving", "batch_size"]
    assert group_keys_from_config(config.replace("source: lengths", "source: ''")) == ["cache"]
