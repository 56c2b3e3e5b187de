"""The sweep's last stage: the results table and CSV, the report, closing the sink, the closing lines.

A report failure is reported and swallowed: every measurement is already journaled and in MLflow.
Ctrl-C and SIGTERM (`SignalInterrupts`) both end a sweep this same, orderly way.
"""

import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from kvsweep.config.schema import KvSweepConfig
from kvsweep.names import CAPACITY_CSV, PARETO_CSV, REPORT_DIR, TASK_JSONL
from kvsweep.redact import redact_uri
from kvsweep.report.report_files import write_results_json, write_tables
from kvsweep.results import RESULT_STATUSES, CellResult

if TYPE_CHECKING:
    from kvsweep.driver.progress import SweepProgress
    from kvsweep.driver.sweep_tracking import Tracking
    from kvsweep.report.report_files import Report
    from kvsweep.report.selection import Decision


class Sweep(Protocol):
    """What the end reads of the sweep that ran (`driver.sweep.Sweep`)."""

    cfg: KvSweepConfig
    run_dir: Path
    tracking: "Tracking"
    results: list[CellResult]
    progress: "SweepProgress"
    tracking_uri: str

    def say(self, line: str) -> None: ...


def finish(sweep: "Sweep") -> int:
    """Tables and report in the run folder (the sink logs them on the parent), then what to open; the exit code."""
    from kvsweep.driver.sweep_forecast import forecast_summary
    from kvsweep.tracking.mlflow_ui import compare_url, runs_url

    results, run_dir, say, tracking = sweep.results, sweep.run_dir, sweep.say, sweep.tracking
    sink, journal = tracking.sink, tracking.journal
    table = write_tables(results, run_dir)
    counts = sweep.progress.counts_by_status()
    journal.write_end("FINISHED", counts)
    report = _write_report(sweep)
    write_results_json(run_dir, results, report.decisions if report else [], tracking.header.params)
    selection = report.short_form if report else ""
    if report and report.capacity:  # the frontiers beside results.csv: logged on the parent with it
        shutil.copyfile(report.folder / CAPACITY_CSV, run_dir / CAPACITY_CSV)
    if report and (report.folder / PARETO_CSV).exists():  # each group's front, beside results.csv
        shutil.copyfile(report.folder / PARETO_CSV, run_dir / PARETO_CSV)
    unsent = sink.close("FINISHED", counts, report.run_tags if report else None, report.run_metrics if report else None)
    say(f"\n{table}\n")
    if selection:
        say(f"{selection}\n  report: {run_dir / REPORT_DIR / 'report.html'}\n")
    if report and (failed := task_failures(report.decisions)):
        say(failed + "\n")
    if summary := forecast_summary(results):
        say(summary + "\n")
    uri = sweep.tracking_uri
    say(f"MLflow: {redact_uri(uri)}  experiment {tracking.header.experiment!r}  parent run {sink.parent_run_id}")
    if unsent:
        say(
            f"  MLflow could not take every result; they are safe in {journal.path}. Send them with:\n"
            f"  python -m kvsweep sync {run_dir}"
        )
    else:
        if not uri.startswith(("http://", "https://")):
            say(f"  mlflow ui --backend-store-uri {redact_uri(uri)}")
        say(f"  runs: {runs_url(uri, sink.tracker.experiment_id)}")
        say(f"  compare strategies: {compare_url(uri, sink.tracker.experiment_id, sink.parent_run_id)}")
    say(f"  local copy: {run_dir}")
    return 0 if all(r.status in RESULT_STATUSES for r in results) else 1


def lease_lost(lost: Exception, journal: Path, results: int) -> int:
    """The one line a sweep ends in when another took its parent while it was stopped or cut off; exit 2."""
    print(
        f"kvsweep: {lost}; its {results} results are in {journal} "
        f"(python -m kvsweep sync {journal.parent} sends those the parent lacks)",
        file=sys.stderr,
        flush=True,
    )
    return 2


def task_failures(decisions: "list[Decision]") -> str:
    """The groups where dynamic failed its own task (so the task judged no cache there), named at the end."""
    failed = [f"{d.label} ({d.uninformative})" for d in decisions if d.dynamic_failed_task]
    if not failed:
        return ""
    return (
        f"Task judged nothing in {len(failed)} group(s), where dynamic itself failed it: {'; '.join(failed)}. "
        f"What the model answered is in each cell's {TASK_JSONL} (MLflow artifacts); KL decided there instead."
    )


def _write_report(sweep: "Sweep") -> "Report | None":
    """The report folder in the run folder (the sink logs it on the parent); None when it could not be written."""
    results, run_dir, cfg, sink, say = sweep.results, sweep.run_dir, sweep.cfg, sweep.tracking.sink, sweep.say
    from kvsweep.driver.capacity_search import search_settings
    from kvsweep.report.report_files import CapacityContext, ReportContext, settings_from, write_report
    from kvsweep.tracking.mlflow_ui import run_url

    links, parent_url = {}, ""
    try:
        experiment_id, uri = sink.tracker.experiment_id, sink.tracker.tracking_uri
        links = {cid: run_url(uri, experiment_id, rid) for cid, rid in sink.cell_runs.items()}
        if sink.parent_run_id:
            parent_url = run_url(uri, experiment_id, sink.parent_run_id)
    except Exception:  # MLflow down: the report goes without links
        pass
    capacity = None
    if cfg.search.batch or cfg.search.contexts:
        capacity = CapacityContext(search_settings(cfg), cfg.report.gpu_hour_cost, cfg.ray.gpus_per_cell)
    title = f"kvsweep report: {cfg.name}" + (f" (parent run {sink.parent_run_id})" if sink.parent_run_id else "")
    try:
        report = write_report(
            results,
            run_dir / REPORT_DIR,
            ReportContext(title, settings_from(selection_values(cfg)), links, parent_url, capacity),
        )
    except Exception as exc:
        say(f"kvsweep: could not write the report ({type(exc).__name__}: {exc}); results are in {run_dir}")
        return None
    return report


def selection_values(cfg: Any) -> dict[str, Any]:
    """What the selection decides by: the `report` section and the SLOs a pick must meet."""
    return {**asdict(cfg.report), "slo_ttft_ms": cfg.slo.ttft_ms, "slo_tpot_ms": cfg.slo.tpot_ms}


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised by `SignalInterrupts`."""


class SignalInterrupts:
    """While entered, SIGINT and SIGTERM raise `Interrupted`, and the signal that came is remembered.

    The exception alone cannot say which: Ray's blocking calls (`ray.wait`, `ray.get`) catch any
    KeyboardInterrupt raised inside them and raise a bare one instead.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)
        raise Interrupted(self.received.name)

    def __enter__(self) -> "SignalInterrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    @property
    def name(self) -> str:
        return (self.received or signal.SIGINT).name  # a KeyboardInterrupt no signal of ours raised: as Ctrl-C

    @property
    def exit_code(self) -> int:
        """The shell's convention, 128 + the signal's number: 130 after Ctrl-C, 143 after SIGTERM."""
        return 128 + (self.received or signal.SIGINT)


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """A second Ctrl-C must not cut the cleanup after the first one short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
