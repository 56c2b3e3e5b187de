"""`python -m kvsweep report`: rebuild a past sweep's report (tables, plots, selection, HTML) from MLflow alone."""

import argparse
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kvsweep.names import RunTag

if TYPE_CHECKING:
    from kvsweep.report.capacity_assessment import CapacityContext

T = TypeVar("T")


def report_main(argv: list[str]) -> int:
    from kvsweep.config.schema import OBJECTIVES, RANK_BY, RANK_BY_PERCENTILES
    from kvsweep.config.tool_variables import default_experiment

    parser = argparse.ArgumentParser(
        prog="python -m kvsweep report",
        description="Rebuild a sweep's report from MLflow: selection table, plots, report.html, selection.md.",
    )
    parser.add_argument("--run-id", help="the sweep's parent run (default: the latest sweep in the experiment)")
    parser.add_argument(
        "--experiment",
        default=default_experiment(),
        help="MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else kvsweep)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", ""),
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)",
    )
    parser.add_argument("--out", type=Path, help="folder for the report (default: kvsweep-report/<parent run id>)")
    parser.add_argument("--max-slowdown", type=float, help="leanest pick within this of the fastest (0.10 = 10%%)")
    parser.add_argument("--min-token-agreement", type=float, help="flag caches agreeing with dynamic less than this")
    parser.add_argument(
        "--max-accuracy-drop", type=float, help="refuse caches whose task accuracy is this far below dynamic's"
    )
    parser.add_argument(
        "--max-kl", type=float, help="where no informative task judges: refuse caches whose mean KL exceeds this (nats)"
    )
    parser.add_argument(
        "--rank-by", choices=(*RANK_BY, *RANK_BY_PERCENTILES), help="what 'fastest' means (a workload: a percentile)"
    )
    parser.add_argument("--objective", choices=OBJECTIVES, help="what the pick optimises within the constraints")
    parser.add_argument(
        "--gpu-hour-cost", type=float, help="price of one GPU-hour: capacity's cost per 1M output tokens (0 = none)"
    )
    args = parser.parse_args(argv)
    overrides = {"max_slowdown": args.max_slowdown, "min_token_agreement": args.min_token_agreement}
    overrides |= {"max_accuracy_drop": args.max_accuracy_drop, "max_kl": args.max_kl, "rank_by": args.rank_by}
    overrides |= {"gpu_hour_cost": args.gpu_hour_cost, "objective": args.objective}
    return rebuild_report(args.tracking_uri, args.experiment, args.run_id, args.out, overrides)


def rebuild_report(
    tracking_uri: str, experiment: str, run_id: str | None, out: Path | None, overrides: dict[str, object]
) -> int:
    """Read the sweep back through `tracking/store.py` (what a resuming sweep reads) and write its report."""
    from kvsweep.config.tool_variables import tracking_uri as resolved_uri
    from kvsweep.redact import redact_uri
    from kvsweep.report.report_files import (
        ReportContext,
        settings_from,
        write_report,
        write_results_json,
        write_tables,
    )
    from kvsweep.tracking.client import tag_runs
    from kvsweep.tracking.mlflow_ui import run_url
    from kvsweep.tracking.store import cell_results, latest_sweep, open_client

    uri = resolved_uri(tracking_uri)
    client = open_client(uri)  # a sweep may be making a fresh sqlite store's tables right now
    if run_id is None:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            print(f"kvsweep report: no experiment named {experiment!r}")
            return 2
        run_id = latest_sweep(client, found.experiment_id)
        if run_id is None:
            print(f"kvsweep report: experiment {experiment!r} has no sweep")
            return 2
    try:
        parent = client.get_run(run_id)
    except Exception as exc:
        print(f"kvsweep report: no run {run_id!r} in {redact_uri(uri)} ({type(exc).__name__})")
        return 2
    experiment_id = parent.info.experiment_id
    results = cell_results(client, experiment_id, run_id, trials=True)
    logged = {k.removeprefix("report."): v for k, v in parent.data.params.items() if k.startswith("report.")}
    logged |= {f"slo_{k.removeprefix('slo.')}": v for k, v in parent.data.params.items() if k.startswith("slo.")}
    settings = settings_from({**logged, **{k: v for k, v in overrides.items() if v is not None}})
    cost = overrides.get("gpu_hour_cost")
    links = {r.cell_id: run_url(uri, experiment_id, r.environment["mlflow_run_id"]) for r in results}
    name = parent.data.tags.get(RunTag.SWEEP, "?")
    context = ReportContext(
        f"kvsweep report: {name} (parent run {run_id})",
        settings,
        links,
        run_url(uri, experiment_id, run_id),
        capacity_context(parent.data.params, None if cost is None else float(str(cost))),
    )
    report = write_report(results, out or Path("kvsweep-report") / run_id, context)
    runs = {r.cell_id: r.environment["mlflow_run_id"] for r in results}
    tag_runs(
        client,
        {runs[cid]: tags for cid, tags in report.run_tags.items() if cid in runs},
        {runs[cid]: metrics for cid, metrics in report.run_metrics.items() if cid in runs},
    )
    table = write_tables(results, report.folder)
    write_results_json(report.folder, results, report.decisions, dict(parent.data.params))
    print(f"sweep {name} (parent run {run_id}): {len(results)} cells\n")
    print(table)
    print(f"\n{report.short_form}\n")
    print(f"report: {report.folder / 'report.html'}")
    return 0


def capacity_context(params: Mapping[str, str], gpu_hour_cost: float | None = None) -> "CapacityContext | None":
    """The capacity search a parent run's params (strings) describe; None when it searched nothing.
    A key the run lacks takes the schema's default; `gpu_hour_cost` (the flag) overrides `report.gpu_hour_cost`."""
    from kvsweep.capacity.frontier import SearchSettings, Slo
    from kvsweep.config.schema import RayConfig, ReportConfig, SearchConfig, SloConfig
    from kvsweep.report.capacity_assessment import CapacityContext

    search = _logged(SearchConfig, "search", params)
    if not (search.batch or search.contexts):
        return None
    slo = _logged(SloConfig, "slo", params)
    cost = _logged(ReportConfig, "report", params).gpu_hour_cost if gpu_hour_cost is None else gpu_hour_cost
    settings = SearchSettings(Slo(slo.tpot_ms, slo.ttft_ms), search.max_batch, search.context_step, search.max_context)
    return CapacityContext(settings, cost, _logged(RayConfig, "ray", params).gpus_per_cell)


def _logged(section: type[T], prefix: str, params: Mapping[str, str]) -> T:
    """A config section from the parent run's `<prefix>.<key>` params (MLflow keeps them as strings); the
    schema's default for a key the run lacks (a sweep from before it existed)."""
    defaults, values = section(), {}
    for f in fields(defaults):
        raw, default = params.get(f"{prefix}.{f.name}"), getattr(defaults, f.name)
        if raw is None or not isinstance(default, bool | int | float):
            continue
        values[f.name] = raw == "True" if isinstance(default, bool) else type(default)(float(raw))
    return section(**values)
