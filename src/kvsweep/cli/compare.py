"""`python -m kvsweep compare A B`: two sweeps side by side, verdicts beyond noise, an exit code for CI.

Exit 0: nothing got worse; 1: a regression (slower, larger, worse beyond the threshold) or a cell
whose status changed away from ok; 2: bad arguments (a run that is not there or not a sweep, nothing
in common), in one line.
"""

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsweep.names import COMPARE_MATCHED_CELLS, COMPARE_REGRESSIONS, COMPARE_ROLE, SWEEP_ROLE, RunTag

if TYPE_CHECKING:
    from kvsweep.compare.comparison import SweepSide
    from kvsweep.compare.judging import Thresholds

RUN_ID = re.compile(r"[0-9a-f]{32}")
REF = re.compile(r"(?P<base>[^~'\"]+)(~(?P<back>\d+))?")


class BadArguments(Exception):
    """What the user asked for cannot be compared; one line, exit 2."""


def compare_main(argv: list[str]) -> int:
    from kvsweep.compare.judging import DEFAULT_MEMORY_THRESHOLD, DEFAULT_THRESHOLD
    from kvsweep.config.tool_variables import default_experiment

    parser = argparse.ArgumentParser(
        prog="python -m kvsweep compare",
        description="Compare two sweeps cell by cell: which metrics changed beyond noise. "
        "A and B: a parent run id, 'latest', 'latest~1' (the one before), a sweep name (its latest run) or NAME~N.",
    )
    parser.add_argument("a", metavar="A", help="the sweep compared against (the baseline, e.g. before an upgrade)")
    parser.add_argument("b", metavar="B", help="the sweep judged (e.g. after the upgrade)")
    parser.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI", ""),
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)",
    )
    parser.add_argument(
        "--experiment",
        default=default_experiment(),
        help="experiment for names and latest (default: MLFLOW_EXPERIMENT_NAME, else kvsweep)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        help=f"timings: smallest change called, B/A beyond 1+T or below 1/(1+T) (default {DEFAULT_THRESHOLD}, above "
        "the drift of identical sweeps on a shared CPU VM; with --baseline: 0, a floor under the measured drift)",
    )
    parser.add_argument(
        "--memory-threshold",
        type=float,
        help=f"the same for memory peaks and quality readings (default {DEFAULT_MEMORY_THRESHOLD}; with --baseline: 0)",
    )
    parser.add_argument(
        "--baseline", help="a repeat of A (same sweep, nothing changed): its drift from A sets each metric's threshold"
    )
    parser.add_argument("--out", type=Path, help="folder for compare.csv/.md/.html (default kvsweep-compare/A-B)")
    parser.add_argument("--log", action="store_true", help="also log the comparison as a run in the experiment")
    parser.add_argument("--all", action="store_true", help="print every row, within noise included")
    args = parser.parse_args(argv)
    try:
        return compare(args)
    except BadArguments as exc:
        print(f"kvsweep compare: {exc}", file=sys.stderr)
        return 2


def compare(args: argparse.Namespace) -> int:
    from kvsweep.compare.compare_files import write_comparison
    from kvsweep.compare.comparison import compare_sweeps
    from kvsweep.compare.judging import DEFAULT_MEMORY_THRESHOLD, DEFAULT_THRESHOLD, drift_thresholds
    from kvsweep.compare.tables import terminal_text
    from kvsweep.config.tool_variables import tracking_uri
    from kvsweep.tracking.store import open_client

    for flag, given in (("--threshold", args.threshold), ("--memory-threshold", args.memory_threshold)):
        if given is not None and not given >= 0:
            raise BadArguments(f"{flag} {given}: must be 0 or more (0.10 = 10%)")
    uri = tracking_uri(args.tracking_uri)
    client = open_client(uri)
    a, b = (_side(client, uri, args.experiment, ref) for ref in (args.a, args.b))
    if a.run_id == b.run_id:
        raise BadArguments(f"A and B are the same run ({a.run_id}): name two sweeps")
    thresholds = _given_thresholds(args, DEFAULT_THRESHOLD, DEFAULT_MEMORY_THRESHOLD)
    if args.baseline:
        repeat = _side(client, uri, args.experiment, args.baseline)
        thresholds = drift_thresholds(a.results, repeat.results, _given_thresholds(args, 0.0, 0.0), repeat.run_id)
        if not thresholds.baseline_cells:
            raise BadArguments(f"--baseline {args.baseline}: shares no cleanly measured cell with A")
    comparison = compare_sweeps(a, b, thresholds)
    if not comparison.matched:
        raise BadArguments(
            f"nothing matches: A ({a.name}, {len(a.results)} cells) and B ({b.name}, {len(b.results)} cells) share no "
            "cell (model, dtype, context, batch, new tokens, cache, compile, inputs)"
        )
    written = write_comparison(comparison, args.out or Path("kvsweep-compare") / f"{a.run_id[:8]}-{b.run_id[:8]}")
    print(terminal_text(comparison, every_row=args.all))
    print(f"\nfiles: {', '.join(str(p) for p in written.files[:3])}")
    if args.log:
        print(f"logged: {_log(client, uri, comparison, written.folder)}")
    return comparison.exit_code


def _given_thresholds(args: argparse.Namespace, timing: float, memory: float) -> "Thresholds":
    """The thresholds the flags give, each flag not given at `timing` / `memory`."""
    from kvsweep.compare.judging import Thresholds

    return Thresholds(
        timing if args.threshold is None else args.threshold,
        memory if args.memory_threshold is None else args.memory_threshold,
    )


def _side(client: Any, uri: str, experiment: str, ref: str) -> "SweepSide":
    from kvsweep.compare.comparison import SweepSide
    from kvsweep.tracking.mlflow_ui import run_url
    from kvsweep.tracking.store import cell_results

    run = resolve(client, experiment, ref)
    experiment_id = run.info.experiment_id
    results = cell_results(client, experiment_id, run.info.run_id)
    name = run.data.tags.get(RunTag.SWEEP, "?")
    return SweepSide(run.info.run_id, name, results, run.data.params, run_url(uri, experiment_id, run.info.run_id))


def resolve(client: Any, experiment: str, ref: str) -> Any:
    """The sweep parent run a reference names: a run id, `latest[~N]`, or a sweep name `NAME[~N]`."""
    from kvsweep.tracking.store import sweep_parents

    if RUN_ID.fullmatch(ref):
        try:
            run = client.get_run(ref)
        except Exception as exc:
            raise BadArguments(f"no run {ref} in the tracking store ({type(exc).__name__})") from exc
        role = run.data.tags.get(RunTag.ROLE, "none")
        if role != SWEEP_ROLE:
            raise BadArguments(f"run {ref} is not a sweep's parent run (its {RunTag.ROLE} is {role})")
        return run
    found = REF.fullmatch(ref)
    if found is None:
        raise BadArguments(f"{ref!r} is neither a run id, latest[~N] nor a sweep name[~N]")
    base, back = found["base"], int(found["back"] or 0)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise BadArguments(f"no experiment named {experiment!r} (for {ref!r})")
    runs = sweep_parents(client, exp.experiment_id, "" if base == "latest" else base, newest=back + 1)
    if len(runs) > back:
        return runs[back]
    if base != "latest" and not runs:
        names = sorted({r.data.tags.get(RunTag.SWEEP, "?") for r in sweep_parents(client, exp.experiment_id)})
        known = ", ".join(names) or "none"
        raise BadArguments(f"no sweep named {base!r} in experiment {experiment!r} (sweeps: {known})")
    which = "sweep runs" if base == "latest" else f"runs of sweep {base!r}"
    raise BadArguments(f"{ref!r}: experiment {experiment!r} has {len(runs)} {which}; {ref} asks for number {back + 1}")


def _log(client: Any, uri: str, comparison: Any, folder: Path) -> str:
    """A run in B's experiment, tagged with both parents, holding the files; its URL."""
    from kvsweep.tracking.mlflow_ui import run_url

    experiment_id = client.get_run(comparison.b.run_id).info.experiment_id
    a, b = comparison.a, comparison.b
    tags = {
        RunTag.ROLE: COMPARE_ROLE,
        RunTag.COMPARE_A: a.run_id,
        RunTag.COMPARE_B: b.run_id,
        RunTag.RUN_NAME: f"compare {a.name} {a.run_id[:8]} -> {b.name} {b.run_id[:8]}",
    }
    run = client.create_run(experiment_id, tags=tags)
    client.log_metric(run.info.run_id, COMPARE_REGRESSIONS, len(comparison.regressions))
    client.log_metric(run.info.run_id, COMPARE_MATCHED_CELLS, comparison.matched)
    client.log_artifacts(run.info.run_id, str(folder))
    client.set_terminated(run.info.run_id, "FINISHED")
    return run_url(uri, experiment_id, run.info.run_id)
