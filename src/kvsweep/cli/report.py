"""`python -m kvsweep report`: rebuild a past sweep's report (tables, plots, selection, HTML) from MLflow alone."""

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvsweep report",
        description="Rebuild a sweep's report from MLflow: selection table, plots, report.html, selection.md.",
    )
    parser.add_argument("--run-id", help="the sweep's parent run (default: the latest sweep in the experiment)")
    parser.add_argument("--experiment", default="kvsweep", help="MLflow experiment (default: kvsweep)")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", ""),
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)",
    )
    parser.add_argument("--out", type=Path, help="folder for the report (default: kvsweep-report/<parent run id>)")
    parser.add_argument("--max-slowdown", type=float, help="leanest pick within this of the fastest (0.10 = 10%%)")
    parser.add_argument("--min-token-agreement", type=float, help="flag caches agreeing with dynamic less than this")
    parser.add_argument("--rank-by", choices=("tpot_ms", "ttft_ms", "e2e_ms"), help="what 'fastest' means")
    args = parser.parse_args(argv)

    from mlflow import MlflowClient

    from kvsweep.redact import redact_uri
    from kvsweep.report.write import ReportContext, settings_from, write_report
    from kvsweep.tracking.client import default_tracking_uri, result_from_run, run_url
    from kvsweep.tracking.names import PARENT_ID_TAG, SWEEP_TAG

    uri = default_tracking_uri(args.tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    parent_id = args.run_id or _latest_sweep(client, args.experiment)
    if parent_id is None:
        return 2
    try:
        parent = client.get_run(parent_id)
    except Exception as exc:
        print(f"kvsweep report: no run {parent_id!r} in {redact_uri(uri)} ({type(exc).__name__})")
        return 2
    experiment_id = parent.info.experiment_id
    cells = client.search_runs([experiment_id], f"tags.`{PARENT_ID_TAG}` = '{parent_id}'", max_results=50000)
    results = [result_from_run(run) for run in cells if "kvsweep.status" in run.data.tags]
    logged = {k.removeprefix("report."): v for k, v in parent.data.params.items() if k.startswith("report.")}
    overrides = {"max_slowdown": args.max_slowdown, "min_token_agreement": args.min_token_agreement}
    overrides["rank_by"] = args.rank_by
    settings = settings_from({**logged, **{k: v for k, v in overrides.items() if v is not None}})
    links = {r.cell_id: run_url(uri, experiment_id, r.environment["mlflow_run_id"]) for r in results}
    name = parent.data.tags.get(SWEEP_TAG, "?")
    context = ReportContext(
        f"kvsweep report: {name} (parent run {parent_id})", settings, links, run_url(uri, experiment_id, parent_id)
    )
    report = write_report(results, args.out or Path("kvsweep-report") / parent_id, context)
    print(f"sweep {name} (parent run {parent_id}): {len(results)} cells\n")
    print((report.folder / "results.txt").read_text())
    print(f"\n{report.short_form}\n")
    print(f"report: {report.folder / 'report.html'}")
    return 0


def _latest_sweep(client: "MlflowClient", experiment_name: str) -> str | None:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        print(f"kvsweep report: no experiment named {experiment_name!r}")
        return None
    sweeps = client.search_runs(
        [experiment.experiment_id],
        "tags.`kvsweep.role` = 'sweep'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not sweeps:
        print(f"kvsweep report: experiment {experiment_name!r} has no sweep")
        return None
    return sweeps[0].info.run_id
