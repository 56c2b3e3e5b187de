"""A saved "compare strategies" view in MLflow's UI for each sweep, opened by one printed link.

MLflow 3's runs page keeps grouping and charts in saved views: an experiment tag
`mlflow.sharedViewState.<key>` holding `{name, createdAt, updatedAt, state: "<JSON>"}` (what the
UI's Views menu writes), opened with `#/experiments/<id>/runs?compareRunsMode=CHART&viewStateShareKey=<key>`.
kvsweep writes one per sweep: only that sweep's cells, grouped by `cache`, with line charts of
TPOT, TTFT and KV cache bytes against `context_length` (a line chart can only put a *metric* on
its x axis, so the axes are logged as metrics as well as params).
"""

import json
import time
from typing import Any

CHARTS = ("tpot_ms", "ttft_ms", "kv_cache_bytes")
SECTION = "kvsweep-compare"


def view_key(parent_run_id: str) -> str:
    return f"kvsweep-{parent_run_id}"


def compare_view_state(parent_run_id: str, metrics: tuple[str, ...] = CHARTS) -> dict[str, Any]:
    charts = [
        {
            "uuid": f"kvsweep-{metric}-by-context",
            "type": "LINE",
            "metricKey": metric,
            "selectedMetricKeys": [metric],
            "xAxisKey": "metric",
            "selectedXAxisMetricKey": "context_length",
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
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "param", "groupByData": "cache"}]},
        "useGroupedValuesInCharts": True,
        "compareRunCharts": charts,
        "compareRunSections": [
            {"uuid": SECTION, "name": "Compare strategies", "display": True, "columns": 1, "cardHeight": 420},
            *folded,
        ],
        "isAccordionReordered": True,
    }


def save_compare_view(client: Any, experiment_id: str, parent_run_id: str, sweep: str) -> str:
    """Writes the view for this sweep; returns its key."""
    now = int(time.time() * 1000)
    state = compare_view_state(parent_run_id)
    envelope = {"name": f"{sweep}: compare strategies", "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    key = view_key(parent_run_id)
    client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{key}", json.dumps(envelope))
    return key


def compare_view_query(parent_run_id: str) -> str:
    return f"?compareRunsMode=CHART&viewStateShareKey={view_key(parent_run_id)}"
