"""Where things are: the tracking URI a sweep uses, the MLflow UI pages a person opens, and the saved
"compare strategies" view in MLflow's UI for each sweep, opened by one printed link.

MLflow 3 keeps a runs page's grouping and charts in saved views: an experiment tag `mlflow.sharedViewState.<key>`
holding `{name, createdAt, updatedAt, state: "<JSON>"}` (what the UI's Views menu writes), opened with
`#/experiments/<id>/runs?compareRunsMode=CHART&viewStateShareKey=<key>`. A line chart can only put a *metric* on
its x axis, so the axes are logged as metrics as well as params. Cells are grouped by `cache` plus every other
grid axis that varies: MLflow averages the runs within a group, so `cache` alone would average batch 1 and 4.
"""

import json
import time
from typing import Any

from omegaconf import OmegaConf

from kvsweep.names import VIEW_TAG_PREFIX, Metric, ResultTag, with_interval
from kvsweep.redact import redact_uri


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


CHARTS = (Metric.TPOT_MS, Metric.TTFT_MS, Metric.KV_CACHE_BYTES, Metric.HOST_OTHER_CPU_SHARE)
# The runs table of the view: the cell's axes, its numbers with their 95% intervals, the contention
# verdict (a contended cell is visible beside its numbers) and the quality verdict beside the task
# accuracy and KL it rests on (canonical column keys).
COLUMNS = (
    *(f"tags.`{t}`" for t in (ResultTag.CONTENDED, ResultTag.CONTENTION, ResultTag.QUALITY_LOSS)),
    *(
        f"metrics.`{m}`"
        for m in (
            *with_interval(Metric.TPOT_MS),
            Metric.HOST_OTHER_CPU_SHARE,
            *with_interval(Metric.PASSKEY_ACCURACY),
            *with_interval(Metric.ANSWER_ACCURACY),
            Metric.KL_DIVERGENCE,
        )
    ),
    *(f"params.`{p}`" for p in ("cache", "context_length", "batch_size", "dtype")),
)
SECTION = "kvsweep-compare"
X_AXIS = "context_length"
# grid key -> the cell param it becomes, in the order groups are named (cache first)
AXIS_PARAMS = {
    "caches": "cache",
    "models": "model",
    "weights": "weights",
    "dtypes": "dtype",
    "batch_sizes": "batch_size",
    "max_new_tokens": "max_new_tokens",
    "compile": "compile",
    "context_lengths": "context_length",
}


def group_keys(grid: dict[str, list[Any]]) -> list[str]:
    """`cache` and every other axis with more than one value, except the charts' x axis: one line per configuration."""
    varying = [param for key, param in AXIS_PARAMS.items() if len({str(v) for v in grid.get(key, [])}) > 1]
    return ["cache", *(p for p in varying if p not in ("cache", X_AXIS))]


def group_keys_from_config(config_yaml: str) -> list[str]:
    """The same from the sweep's saved config (the YAML logged on its parent run, kept in its journal). A workload
    sweep's cells differ by serving mode and B instead of context and new tokens (the mix replaces those axes), and
    by offered rate when `workload.rate` has several."""
    config = OmegaConf.to_container(OmegaConf.create(config_yaml or "{}"))
    grid, workload = config.get("grid") or {}, config.get("workload") or {}
    if not workload.get("source"):
        return group_keys(grid)
    shaped = {k: v for k, v in grid.items() if k not in ("context_lengths", "max_new_tokens", "batch_sizes")}
    rates = ["rate"] if len({str(r) for r in workload.get("rate") or []}) > 1 else []
    return [*group_keys(shaped), "serving", "batch_size", *rates]


def view_key(parent_run_id: str) -> str:
    return f"kvsweep-{parent_run_id}"


def compare_view_state(
    parent_run_id: str, groups: list[str] | None = None, metrics: tuple[str, ...] = CHARTS
) -> dict[str, Any]:
    charts = [
        {
            "uuid": f"kvsweep-{metric}-by-context",
            "type": "LINE",
            "metricKey": metric,
            "selectedMetricKeys": [metric],
            "xAxisKey": "metric",
            "selectedXAxisMetricKey": X_AXIS,
            "useGlobalXaxisKey": False,
            "displayPoints": True,
            "scaleType": "linear",
            "xAxisScaleType": "linear",
            "lineSmoothness": 0,
            "runsCountToCompare": 500,
            "metricSectionId": SECTION,
            "deleted": False,
            "isGenerated": False,
        }
        for metric in metrics
    ]
    folded = [
        {"uuid": f"kvsweep-{name.lower().replace(' ', '-')}", "name": name, "display": False, "isGenerated": True}
        for name in ("Model metrics", "System metrics")
    ]
    return {
        # Sorting by anything but creation time lists the cells flat (not folded under the parent).
        "searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
        "orderByKey": "params.`cache`",
        "orderByAsc": True,
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "param", "groupByData": key} for key in groups or ["cache"]],
        },
        "useGroupedValuesInCharts": True,
        "selectedColumns": list(COLUMNS),
        "compareRunCharts": charts,
        "compareRunSections": [
            {"uuid": SECTION, "name": "Compare strategies", "display": True, "columns": 1, "cardHeight": 420},
            *folded,
        ],
        "isAccordionReordered": True,
    }


def save_compare_view(client: Any, experiment_id: str, parent_run_id: str, sweep: str, groups: list[str]) -> str:
    """Writes the view for this sweep; returns its key."""
    now = int(time.time() * 1000)
    state = compare_view_state(parent_run_id, groups)
    envelope = {"name": f"{sweep}: compare strategies", "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    key = view_key(parent_run_id)
    client.set_experiment_tag(experiment_id, f"{VIEW_TAG_PREFIX}{key}", json.dumps(envelope))
    return key


def compare_view_query(parent_run_id: str) -> str:
    return f"?compareRunsMode=CHART&viewStateShareKey={view_key(parent_run_id)}"
