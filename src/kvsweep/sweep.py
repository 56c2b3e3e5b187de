"""One sweep, end to end: config -> cells -> plan -> Ray -> MLflow -> table.

Modules are used in the data's direction only; this file wires them and owns the exit code.
"""

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvsweep.delivery import REPORT_DIR, shape_only_tags
from kvsweep.grid import cell_id
from kvsweep.interrupts import Interrupted, interrupts_ignored, sigterm_interrupts
from kvsweep.journal import Journal, SweepHeader
from kvsweep.model_names import display_names
from kvsweep.progress import SweepProgress
from kvsweep.prune import OomPruner, size_order
from kvsweep.redact import redact_text, redact_uri
from kvsweep.results import ERROR, RESULT_STATUSES, SKIPPED, CellResult
from kvsweep.sweep_plan import plan_sweep, plan_text, predicted_metrics, protocol_of
from kvsweep.table import results_csv, results_table

if TYPE_CHECKING:
    from kvsweep.sink import MlflowSink


def sweep_key(cfg: dict[str, Any]) -> str:
    """Identity of "the same sweep" for resume: what is measured and where it is logged, not how it is run."""
    identity = {k: cfg[k] for k in ("name", "grid", "measure", "device", "trust_remote_code")}
    identity["experiment"] = cfg["mlflow"]["experiment"]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_sweep(cfg: dict[str, Any], config_yaml: str, run_dir: Path, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from kvsweep import ray_session
    from kvsweep.scheduler import CellScheduler, Job, Limits
    from kvsweep.sink import MlflowSink
    from kvsweep.tracking import SweepTracker, compare_url, default_tracking_uri, runs_url

    progress: SweepProgress | None = None  # once cells are planned; on a terminal messages print above it

    def say(text: str) -> None:
        if progress is None:
            print(redact_text(text), file=out, flush=True)
        else:
            progress.say(redact_text(text))

    tracking_uri = default_tracking_uri(cfg["mlflow"]["tracking_uri"])  # absolute before Ray starts
    config_yaml = redact_text(config_yaml)
    session = ray_session.connect(cfg["ray"]["address"])
    try:
        device = ray_session.resolve_device(cfg["device"], session)
        ray_cfg = cfg["ray"]
        needs = ray_session.CellNeeds(
            gpus=ray_cfg["gpus_per_cell"] if device == "cuda" else 0,
            cpus=ray_cfg["cpus_per_cell"],
            accelerator_type=ray_cfg["accelerator_type"],
            resources=ray_cfg["resources"],
        )
        ray_session.check_fits(needs)
        protocol = protocol_of(cfg, device)
        planned, problems = plan_sweep(cfg, device)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "plan.txt").write_text(redact_text(plan_text(planned, problems, device)))

        params = {
            "name": cfg["name"],
            "cells": len(planned),
            "device": device,
            "trust_remote_code": cfg["trust_remote_code"],
            **{f"measure.{k}": v for k, v in cfg["measure"].items()},
            **{f"report.{k}": v for k, v in cfg["report"].items()},
        }
        header = SweepHeader(
            cfg["name"],
            sweep_key(cfg),
            cfg["mlflow"]["experiment"],
            redact_uri(tracking_uri),  # on disk without credentials; `sync` gets them from MLflow's variables
            device,
            config_yaml,
            params,
            model_names=display_names(cfg["grid"]["models"]),
        )
        journal = Journal(run_dir)
        journal.write_header(header)
        sink = MlflowSink(SweepTracker(tracking_uri, header.experiment), journal, header, say)
        done = sink.open(resume=not cfg["rerun"])
        say(
            f"sweep {cfg['name']}: {len(planned)} cells on {device}; trust_remote_code={cfg['trust_remote_code']}; "
            f"MLflow {redact_uri(tracking_uri)} parent run {sink.parent_run_id or '(pending)'}"
        )

        results: list[CellResult] = []
        jobs: list[Job] = []
        to_run = sum(p.runs and p.cell.model not in problems for p in planned)
        progress = SweepProgress(len(planned), to_run, out, header.model_names)
        pruner = OomPruner(cfg["infer_oom"])

        planned_by_id = {cell_id(p.cell, protocol): p for p in planned}

        def record(result: CellResult, ran: bool = True) -> None:
            result.metrics.update(predicted_metrics(planned_by_id[result.cell_id]))
            result.error, result.traceback = redact_text(result.error), redact_text(result.traceback)
            result.cell = {**result.cell, "model": redact_text(str(result.cell["model"]))}
            result.tags.update(shape_only_tags(result.cell["model"]))
            results.append(result)
            journal.append(result)  # on disk before MLflow sees it
            pruner.observe(result)
            sink.finished(result)
            progress.finished(result, ran)

        for p in planned:
            cid = cell_id(p.cell, protocol)
            if cid in done:
                results.append(done[cid])
                pruner.observe(done[cid])
                progress.resumed(done[cid], counts_as_run=p.runs)
            elif p.cell.model in problems:
                record(CellResult(cid, p.cell.to_dict(), ERROR, error=problems[p.cell.model]), ran=False)
            elif not p.runs:
                record(CellResult(cid, p.cell.to_dict(), SKIPPED, error=p.skip_reason or ""), ran=False)
            else:
                jobs.append(Job(cid, p.cell.to_dict()))
        if done:
            say(
                f"resuming: {len(done)} of {len(planned)} cells already have results in parent run "
                f"{sink.parent_run_id}; rerun=true starts afresh"
            )
        jobs.sort(key=size_order)  # small before large, so an OOM can spare the larger cells

        limits = Limits(
            needs=needs,
            max_concurrent=max_concurrent(ray_cfg["max_concurrent"], device, session.gpus, ray_cfg["gpus_per_cell"]),
            cell_timeout_s=ray_cfg["cell_timeout_s"],
            max_retries=ray_cfg["max_retries"],
            prestart=ray_cfg["prestart"],
        )
        scheduler = CellScheduler(
            protocol.to_dict(),
            limits,
            cfg["testing"],
            {"trust_remote_code": cfg["trust_remote_code"], "wait_idle_gpu_s": cfg["measure"]["wait_for_idle_gpu_s"]},
        )

        def started(job: Job) -> None:
            progress.started(job.cell_id, job.cell)
            sink.started(job.cell_id, job.cell)

        try:
            with sigterm_interrupts(), progress.shown():
                scheduler.run(jobs, record, started, pruner.admit)
        except KeyboardInterrupt as exc:
            with interrupts_ignored():
                killed = scheduler.kill_all()
                sink.interrupt([(job.cell_id, job.cell) for job in killed])
                journal.write_end("KILLED", progress.counts_by_status())
            say(
                f"\ninterrupted ({exc or 'SIGINT'}): {len(killed)} running cells killed; {len(results)} results kept "
                f"in {journal.path}. Run the same command again to resume."
            )
            return 143 if isinstance(exc, Interrupted) else 130

        table = results_table(results)
        (run_dir / "results.csv").write_text(results_csv(results))
        (run_dir / "results.txt").write_text(table)
        counts = progress.counts_by_status()
        journal.write_end("FINISHED", counts)
        selection = _write_report(results, run_dir, cfg, sink, say)
        unsent = sink.close("FINISHED", counts)
        say(f"\n{table}\n")
        if selection:
            say(f"{selection}\n  report: {run_dir / REPORT_DIR / 'report.html'}\n")
        say(f"MLflow: {redact_uri(tracking_uri)}  experiment {header.experiment!r}  parent run {sink.parent_run_id}")
        if unsent:
            say(
                f"  MLflow could not take every result; they are safe in {journal.path}. Send them with:\n"
                f"  python -m kvsweep sync {run_dir}"
            )
        else:
            if not tracking_uri.startswith(("http://", "https://")):
                say(f"  mlflow ui --backend-store-uri {redact_uri(tracking_uri)}")
            say(f"  runs: {runs_url(tracking_uri, sink.tracker.experiment_id)}")
            say(f"  compare strategies: {compare_url(tracking_uri, sink.tracker.experiment_id, sink.parent_run_id)}")
        say(f"  local copy: {run_dir}")
        return 0 if all(r.status in RESULT_STATUSES for r in results) else 1
    finally:
        ray_session.shutdown(session)


def _write_report(
    results: list[CellResult], run_dir: Path, cfg: dict[str, Any], sink: "MlflowSink", say: Callable[[str], None]
) -> str:
    """The report folder in the run folder (the sink logs it on the parent); returns the short selection.

    A failure here is reported and swallowed: every measurement is already journaled and in MLflow.
    """
    from kvsweep.report.write import ReportContext, settings_from, write_report
    from kvsweep.tracking import run_url

    links, parent_url = {}, ""
    try:
        experiment_id, uri = sink.tracker.experiment_id, sink.tracker.tracking_uri
        links = {cid: run_url(uri, experiment_id, rid) for cid, rid in sink.cell_runs.items()}
        if sink.parent_run_id:
            parent_url = run_url(uri, experiment_id, sink.parent_run_id)
    except Exception:  # MLflow down: the report goes without links
        pass
    title = f"kvsweep report: {cfg['name']}" + (f" (parent run {sink.parent_run_id})" if sink.parent_run_id else "")
    try:
        report = write_report(
            results, run_dir / REPORT_DIR, ReportContext(title, settings_from(cfg["report"]), links, parent_url)
        )
    except Exception as exc:
        say(f"kvsweep: could not write the report ({type(exc).__name__}: {exc}); results are in {run_dir}")
        return ""
    return report.short_form


def max_concurrent(configured: int, device: str, gpus: float, gpus_per_cell: int) -> int:
    """Default: one cell per GPU group on CUDA; on CPU one at a time so timings do not interfere."""
    if configured > 0:
        return configured
    return max(1, int(gpus // gpus_per_cell)) if device == "cuda" else 1
