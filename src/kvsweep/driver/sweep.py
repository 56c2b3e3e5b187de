"""One sweep, end to end: config -> cells -> plan -> Ray -> MLflow -> table.

Modules are used in the data's direction only; this file wires them and owns the exit code.
"""

import hashlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.interrupts import SignalInterrupts, interrupts_ignored
from kvsweep.driver.oom_inference import OomPruner, size_order
from kvsweep.driver.progress import SweepProgress
from kvsweep.driver.sweep_end import finish
from kvsweep.grid import cell_id
from kvsweep.model_names import display_names
from kvsweep.models.presets import shape_only_tags
from kvsweep.plan.sweep_plan import plan_sweep, plan_text, predicted_metrics, protocol_of
from kvsweep.redact import redact_text, redact_uri
from kvsweep.results import ERROR, SKIPPED, CellResult
from kvsweep.testing.seams import Seams
from kvsweep.tracking.journal import Journal, SweepHeader

if TYPE_CHECKING:
    from kvsweep.driver.scheduler import Job


def sweep_key(cfg: KvSweepConfig) -> str:
    """Identity of "the same sweep" for resume: what is measured and where it is logged, not how it is run."""
    whole = asdict(cfg)
    identity = {k: whole[k] for k in ("name", "grid", "measure", "device", "trust_remote_code")}
    identity["experiment"] = cfg.mlflow.experiment
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def run_sweep(
    cfg: KvSweepConfig, config_yaml: str, run_dir: Path, out: TextIO | None = None, seams: Seams | None = None
) -> int:
    """The sweep's stages in order: connect (the warm templates start importing at once), plan, open
    tracking, build native extensions, resume, schedule (recording each result), then the table, the
    report and the closing lines. Returns the exit code."""
    from kvsweep.driver import ray_session
    from kvsweep.driver.prewarm import prewarm

    sweep = SweepRun(cfg, redact_text(config_yaml), run_dir, out or sys.stdout, seams or Seams())
    prewarm()  # MLflow and the report's imports overlap Ray's start
    session = ray_session.connect(cfg.ray.address)  # the tracking URI was made absolute before this
    try:
        sweep.connect(session)
        sweep.launch_templates()
        sweep.plan()
        sweep.open_tracking()
        sweep.prebuild()
        jobs = sweep.queue()
        interrupted = sweep.schedule(jobs)
        return interrupted if interrupted is not None else finish(sweep)
    finally:
        ray_session.shutdown(session)


class SweepRun:
    """What the stages share: the config, where results go, and the results so far."""

    def __init__(self, cfg: KvSweepConfig, config_yaml: str, run_dir: Path, out: TextIO, seams: Seams) -> None:
        from kvsweep.tracking.urls import default_tracking_uri

        self.cfg, self.config_yaml, self.run_dir, self.out, self.seams = cfg, config_yaml, run_dir, out, seams
        self.tracking_uri = default_tracking_uri(cfg.mlflow.tracking_uri)  # absolute before Ray starts
        self.progress: SweepProgress | None = None  # once cells are planned; messages then print above it
        self.results: list[CellResult] = []
        self.pruner = OomPruner(cfg.infer_oom)

    def say(self, text: str) -> None:
        if self.progress is None:
            print(redact_text(text), file=self.out, flush=True)
        else:
            self.progress.say(redact_text(text))

    def connect(self, session: Any) -> None:
        """The device cells run on, and what each needs from the cluster (checked to fit)."""
        from kvsweep.driver import ray_session

        self.session = session
        self.device = ray_session.resolve_device(self.cfg.device, session)
        ray_cfg = self.cfg.ray
        self.needs = ray_session.CellNeeds(
            gpus=ray_cfg.gpus_per_cell if self.device == "cuda" else 0,
            cpus=ray_cfg.cpus_per_cell,
            accelerator_type=ray_cfg.accelerator_type,
            resources=dict(ray_cfg.resources),
        )
        ray_session.check_fits(self.needs)

    def launch_templates(self) -> None:
        """Warm templates start importing now, overlapping the plan and MLflow; the first cell waits."""
        from kvsweep.driver.templates import launch_templates

        self.templates = launch_templates() if self.cfg.ray.fork_cells else None

    def plan(self) -> None:
        self.protocol = protocol_of(self.cfg.measure, self.device)
        self.planned, self.problems = plan_sweep(self.cfg, self.device)
        self.planned_by_id = {cell_id(p.cell, self.protocol): p for p in self.planned}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "plan.txt").write_text(redact_text(plan_text(self.planned, self.problems, self.device)))

    def open_tracking(self) -> None:
        """The journal first (results are on disk before MLflow sees them), then the MLflow sink."""
        from kvsweep.tracking.client import SweepTracker
        from kvsweep.tracking.sink import MlflowSink

        cfg = self.cfg
        params = {
            "name": cfg.name,
            "cells": len(self.planned),
            "device": self.device,
            "trust_remote_code": cfg.trust_remote_code,
            **{f"measure.{k}": v for k, v in asdict(cfg.measure).items()},
            **{f"report.{k}": v for k, v in asdict(cfg.report).items()},
        }
        self.header = SweepHeader(
            cfg.name,
            sweep_key(cfg),
            cfg.mlflow.experiment,
            redact_uri(self.tracking_uri),  # on disk without credentials; `sync` gets them from MLflow's variables
            self.device,
            self.config_yaml,
            params,
            model_names=display_names(cfg.grid.models),
        )
        self.journal = Journal(self.run_dir)
        self.journal.write_header(self.header)
        self.sink = MlflowSink(
            SweepTracker(self.tracking_uri, self.header.experiment), self.journal, self.header, self.say
        )
        self.done = self.sink.open(resume=not cfg.rerun)
        self.say(
            f"sweep {cfg.name}: {len(self.planned)} cells on {self.device}; "
            f"trust_remote_code={cfg.trust_remote_code}; "
            f"MLflow {redact_uri(self.tracking_uri)} parent run {self.sink.parent_run_id or '(pending)'}"
        )

    def prebuild(self) -> None:
        """Native extensions the pending cells need (quanto's CUDA kernels) are built now, once per node."""
        from kvsweep.driver.native_builds import prebuild

        pending = [p for p in self.planned if cell_id(p.cell, self.protocol) not in self.done]
        after = dict(zip(map(id, pending), prebuild(pending, self.device, self.say), strict=True))
        self.planned = [after.get(id(p), p) for p in self.planned]
        self.planned_by_id = {cell_id(p.cell, self.protocol): p for p in self.planned}

    def queue(self) -> list["Job"]:
        """Resume what has results, record what will not run, and queue the rest (small cells first)."""
        from kvsweep.driver.scheduler import Job

        to_run = sum(p.runs and p.cell.model not in self.problems for p in self.planned)
        self.progress = SweepProgress(len(self.planned), to_run, self.out, self.header.model_names)
        jobs: list[Job] = []
        for p in self.planned:
            cid = cell_id(p.cell, self.protocol)
            if cid in self.done:
                self.results.append(self.done[cid])
                self.pruner.observe(self.done[cid])
                self.progress.resumed(self.done[cid], counts_as_run=p.runs)
            elif p.cell.model in self.problems:
                self.record(CellResult(cid, p.cell, ERROR, error=self.problems[p.cell.model]), ran=False)
            elif not p.runs:
                self.record(CellResult(cid, p.cell, SKIPPED, error=p.skip_reason or ""), ran=False)
            else:
                jobs.append(Job(cid, p.cell))
        if self.done:
            self.say(
                f"resuming: {len(self.done)} of {len(self.planned)} cells already have results in parent run "
                f"{self.sink.parent_run_id}; rerun=true starts afresh"
            )
        return sorted(jobs, key=size_order)  # small before large, so an OOM can spare the larger cells

    def record(self, result: CellResult, ran: bool = True) -> None:
        """One result: redacted, journaled (on disk before MLflow sees it), then sent and shown."""
        assert self.progress is not None
        result.metrics.update(predicted_metrics(self.planned_by_id[result.cell_id]))
        result.error, result.traceback = redact_text(result.error), redact_text(result.traceback)
        result.cell = replace(result.cell, model=redact_text(result.cell.model))
        result.tags.update(shape_only_tags(result.cell.model))
        self.results.append(result)
        self.journal.append(result)
        self.pruner.observe(result)
        self.sink.finished(result)
        self.progress.finished(result, ran)

    def schedule(self, jobs: list["Job"]) -> int | None:
        """Runs the queued cells; on SIGINT/SIGTERM kills them, keeps what finished, returns the exit code."""
        from kvsweep.caches import registered_beyond_built_ins
        from kvsweep.driver.ray_session import send_strategies_by_value
        from kvsweep.driver.scheduler import CellScheduler, Job, Limits

        assert self.progress is not None
        progress, ray_cfg = self.progress, self.cfg.ray
        limits = Limits(
            needs=self.needs,
            max_concurrent=max_concurrent(
                ray_cfg.max_concurrent, self.device, self.session.gpus, ray_cfg.gpus_per_cell
            ),
            cell_timeout_s=ray_cfg.cell_timeout_s,
            max_retries=ray_cfg.max_retries,
            prestart=ray_cfg.prestart,
        )
        options = {
            "trust_remote_code": self.cfg.trust_remote_code,
            "wait_idle_gpu_s": self.cfg.measure.wait_for_idle_gpu_s,
            "strategies": send_strategies_by_value(registered_beyond_built_ins()),  # an actor knows the built-ins
        }
        scheduler = CellScheduler(
            self.protocol.to_dict(), limits, self.seams.to_dict(), options, templates=self.templates
        )
        if scheduler.template_problem:
            self.say(f"no warm template ({scheduler.template_problem}); each cell imports in its own process")

        def started(job: Job) -> None:
            progress.started(job.cell_id, job.cell)
            self.sink.started(job.cell_id, job.cell)

        interrupts = SignalInterrupts()
        try:
            with interrupts, progress.shown():
                scheduler.run(jobs, self.record, started, self.pruner.admit)
        except KeyboardInterrupt:
            with interrupts_ignored():
                killed = scheduler.kill_all()
                self.sink.interrupt([(job.cell_id, job.cell) for job in killed])
                self.journal.write_end("KILLED", progress.counts_by_status())
            self.say(
                f"\ninterrupted ({interrupts.name}): {len(killed)} running cells killed; {len(self.results)} "
                f"results kept in {self.journal.path}. Run the same command again to resume."
            )
            return interrupts.exit_code
        return None


def max_concurrent(configured: int, device: str, gpus: float, gpus_per_cell: int) -> int:
    """Default: one cell per GPU group on CUDA; on CPU one at a time so timings do not interfere."""
    if configured > 0:
        return configured
    return max(1, int(gpus // gpus_per_cell)) if device == "cuda" else 1
