"""`python -m kvsweep report`: rebuild a past sweep's results table from MLflow alone."""

import argparse
import os
from pathlib import Path

from kvsweep.table import results_csv, results_table


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvsweep report")
    parser.add_argument("--run-id", help="the sweep's parent run (default: the latest sweep)")
    parser.add_argument("--experiment", default="kvsweep")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""))
    parser.add_argument("--out", type=Path, help="folder for results.csv and results.txt")
    args = parser.parse_args(argv)

    from mlflow import MlflowClient

    from kvsweep.tracking import PARENT_ID_TAG, default_tracking_uri, result_from_run

    client = MlflowClient(tracking_uri=default_tracking_uri(args.tracking_uri))
    parent_id = args.run_id
    if not parent_id:
        experiment = client.get_experiment_by_name(args.experiment)
        if experiment is None:
            print(f"kvsweep report: no experiment named {args.experiment!r}")
            return 2
        sweeps = client.search_runs(
            [experiment.experiment_id],
            "tags.`kvsweep.role` = 'sweep'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if not sweeps:
            print(f"kvsweep report: experiment {args.experiment!r} has no sweep")
            return 2
        parent_id = sweeps[0].info.run_id
    parent = client.get_run(parent_id)
    cells = client.search_runs(
        [parent.info.experiment_id], f"tags.`{PARENT_ID_TAG}` = '{parent_id}'", max_results=50000
    )
    results = [result_from_run(run) for run in cells]
    table = results_table(results)
    print(f"sweep {parent.data.tags.get('kvsweep.sweep', '?')} (parent run {parent_id}): {len(results)} cells\n")
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.csv").write_text(results_csv(results))
        (args.out / "results.txt").write_text(table)
    return 0
