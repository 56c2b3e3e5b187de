"""One sweep, end to end: config -> cells -> plan -> Ray -> MLflow -> table.

Modules are used in the data's direction only; this file wires them and owns the exit code.
"""

import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeVar

from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.interrupts import SignalInterrupts, interrupts_ignored
from kvsweep.driver.oom_inference import OomPruner, size_order
from kvsweep.driver.progress import SweepProgress
from kvsweep.driver.sweep_finish import finish
from kvsweep.driver.sweep_identity import earlier_revisions, left_parent_note, sweep_key
from kvsweep.errors import first_line
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.model_names import display_names
from kvsweep.models.presets import shape_only_tags
from kvsweep.names import HUB_FETCH_S, ResultTag
from kvsweep.plan.cell_plan import PlannedCell, plan_cell
from kvsweep.plan.sweep_plan import plan_limits, plan_sweep, plan_text, predicted_metrics, protocol_of
from kvsweep.redact import redact_text, redact_uri
from kvsweep.results import ERROR, SKIPPED, CellResult
from kvsweep.testing.testing_config import Seams
from kvsweep.tracking.journal import Journal, SweepHeader
from kvsweep.tracking.lease_owner import LeaseHeld

if TYPE_CHECKING:
    from kvsweep.driver.capacity_search import CapacitySearches
    from kvsweep.driver.inputs_choice import InputsChoice
    from kvsweep.driver.ray_session import CellNeeds, RaySession
    from kvsweep.driver.scheduler import Job
    from kvsweep.driver.software_survey import Survey
    from kvsweep.driver.template_launch import Templates
    from kvsweep.models.facts import ModelFacts
    from kvsweep.tracking.client import SweepTracker
    from kvsweep.tracking.sink import MlflowSink

T = TypeVar("T")


def run_sweep(
    cfg: KvSweepConfig,
    config_yaml: str,
    run_dir: Path,
    out: TextIO | None = None,
    seams: Seams | None = None,
    inputs: "InputsChoice | None" = None,
) -> int:
    """The sweep's stages in order: what each model is fed (before Ray: a bad prompts file is exit 2),
    connect (the warm templates start importing at once), plan, open tracking, fetch Hub models, build native
    extensions, resume, schedule (recording each result), then the table, the report and the closing lines.
    `inputs`: the choice, when the caller made it already. Returns the exit code."""
    from kvsweep.driver import ray_session
    from kvsweep.driver.capacity_search import search_lines
    from kvsweep.driver.inputs_choice import choose_inputs
    from kvsweep.driver.prewarm import prewarm

    inputs = inputs or choose_inputs(cfg)
    sweep = SweepRun(cfg, redact_text(config_yaml), run_dir, out or sys.stdout, seams or Seams(), inputs)
    for line in [*inputs.lines(), *search_lines(cfg)]:
        sweep.say(line)
    prewarm()  # MLflow and the report's imports overlap Ray's start
    session = ray_session.connect(cfg.ray.address)  # the tracking URI was made absolute before this
    try:
        sweep.connect(session)
        sweep.plan()
        try:
            sweep.open_tracking()
        except LeaseHeld as held:  # an identical sweep is writing to the parent this one would resume
            print(f"kvsweep: {held}", file=sys.stderr, flush=True)
            return 2
        sweep.prefetch()
        sweep.prebuild()
        jobs = sweep.queue()
        interrupted = sweep.schedule(jobs)
        return interrupted if interrupted is not None else finish(sweep)
    finally:
        sweep.release()
        ray_session.shutdown(session)


class StageNotRun(RuntimeError):
    """A stage of the sweep asked for what an earlier stage produces before that stage ran."""


@dataclass(frozen=True)
class Connected:
    """What `connect` produces: the cluster, the device cells run on, what each cell needs, the templates."""

    session: "RaySession"
    device: str
    needs: "CellNeeds"
    templates: "Templates | None"  # None: ray.fork_cells=false, each cell measures in its own actor
    software: "Survey | None" = None  # what each node that can run a cell reported (None: not surveyed)


@dataclass(frozen=True)
class Planned:
    """What `plan` produces (`prebuild` replaces it with the cells its native builds changed)."""

    protocol: MeasureProtocol
    cells: list[PlannedCell]  # a capacity search's: each search's first probe (it plans the others as it goes)
    problems: dict[str, str]  # model -> why none of its cells can run
    searches: "CapacitySearches | None" = None  # search.batch / search.contexts: the frontiers to find

    @cached_property
    def by_id(self) -> dict[str, PlannedCell]:
        """Each planned cell by its id (hashed once per plan)."""
        return {cell_id(p.cell, self.protocol): p for p in self.cells}


@dataclass(frozen=True)
class Tracking:
    """What `open_tracking` produces: the journal, the MLflow sink, and the results MLflow already has."""

    header: SweepHeader
    journal: Journal
    sink: "MlflowSink"
    done: dict[str, CellResult]  # by cell id: resumed, not run again


def produced(value: T | None, stage: str) -> T:
    """What `SweepRun.<stage>()` produced; asking before it ran is a mistake in the stages' order."""
    if value is None:
        raise StageNotRun(f"SweepRun.{stage}() has not run yet: run_sweep runs the stages in order")
    return value


class SweepRun:
    """What the stages share: the config, where results go, what each stage produced, the results so far.

    Each stage's product is declared here, empty until the stage runs; a stage that asks for an
    earlier stage's product too soon raises `StageNotRun`, naming the stage.
    """

    def __init__(
        self, cfg: KvSweepConfig, config_yaml: str, run_dir: Path, out: TextIO, seams: Seams, inputs: "InputsChoice"
    ) -> None:
        from kvsweep.tracking.urls import default_tracking_uri

        self.cfg, self.config_yaml, self.run_dir, self.out, self.seams = cfg, config_yaml, run_dir, out, seams
        self.inputs = inputs
        self.tracking_uri = default_tracking_uri(cfg.mlflow.tracking_uri)  # absolute before Ray starts
        self.results: list[CellResult] = []
        self.pruner = OomPruner(cfg.infer_oom)
        self._connected: Connected | None = None
        self._planned: Planned | None = None
        self._tracking: Tracking | None = None
        self._progress: SweepProgress | None = None  # from `queue`; messages then print above it
        self.hub_cache: dict[str, str] = {}  # from `prefetch`: the Hub models fetched, each with its cache

    @property
    def connected(self) -> Connected:
        return produced(self._connected, "connect")

    @property
    def planned(self) -> Planned:
        return produced(self._planned, "plan")

    @property
    def tracking(self) -> Tracking:
        return produced(self._tracking, "open_tracking")

    @property
    def progress(self) -> SweepProgress:
        """The progress display `queue` starts (it counts the results as they come)."""
        return produced(self._progress, "queue")

    def say(self, text: str) -> None:
        if self._progress is None:
            print(redact_text(text), file=self.out, flush=True)
        else:
            self._progress.say(redact_text(text))

    def release(self) -> None:
        """The parent run's lease ends with the sweep, however it ends (nothing to do before `open_tracking`)."""
        if self._tracking is not None:
            self._tracking.sink.release()

    def connect(self, session: "RaySession") -> None:
        """The device cells run on, and what each needs from the cluster (checked to fit), and the same software
        on every node that can run one (`software_survey.py`: a mismatch is exit 2 here). The warm templates
        start importing now, overlapping the plan and MLflow; the first cell waits for them."""
        from kvsweep.driver import ray_session
        from kvsweep.driver.software_survey import check_software
        from kvsweep.driver.template_launch import launch_templates

        device = ray_session.resolve_device(self.cfg.device, session)
        ray_cfg = self.cfg.ray
        needs = ray_session.CellNeeds(
            gpus=ray_cfg.gpus_per_cell if device == "cuda" else 0,
            cpus=ray_cfg.cpus_per_cell,
            accelerator_type=ray_cfg.accelerator_type,
            resources=dict(ray_cfg.resources),
        )
        ray_session.check_fits(needs)
        software = check_software(needs, session.local, ray_cfg.allow_mixed_versions, self.say)
        templates = launch_templates() if ray_cfg.fork_cells else None
        self._connected = Connected(session, device, needs, templates, software)

    def plan(self) -> None:
        from kvsweep.driver.capacity_search import plan_searches, search_text

        device, spec, cfg = self.connected.device, self.inputs.spec, self.cfg
        limits = plan_limits(cfg, device, spec)
        protocol = protocol_of(cfg.measure, device, spec, limits.gpus)
        searches = None
        if cfg.search.batch or cfg.search.contexts:
            searches, problems = plan_searches(cfg, device, limits, protocol, self.inputs.by_model)
            cells = searches.first_probes()
        else:
            cells, problems = plan_sweep(cfg, device, limits, self.inputs.by_model)
        self._planned = Planned(protocol, cells, problems, searches)
        text = plan_text(cells, problems, device, limits)
        if searches is not None:
            text = "\n".join(search_text(searches)) + "\n\nfirst probes: " + text
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "plan.txt").write_text(redact_text(text))

    def open_tracking(self) -> None:
        """The journal first (results are on disk before MLflow sees them), then the MLflow sink."""
        from kvsweep.tracking.client import SweepTracker
        from kvsweep.tracking.lease import LeaseTimes
        from kvsweep.tracking.sink import MlflowSink

        cfg, device, planned = self.cfg, self.connected.device, self.planned
        params = {
            "name": cfg.name,
            "cells": len(planned.cells),
            "device": device,
            "trust_remote_code": cfg.trust_remote_code,
            **{f"measure.{k}": v for k, v in asdict(cfg.measure).items()},
            **{f"report.{k}": v for k, v in asdict(cfg.report).items()},
            **{f"search.{k}": v for k, v in asdict(cfg.search).items()},
            **{f"slo.{k}": v for k, v in asdict(cfg.slo).items()},
            "ray.gpus_per_cell": cfg.ray.gpus_per_cell,
        }
        header = SweepHeader(
            cfg.name,
            sweep_key(cfg),
            cfg.mlflow.experiment,
            redact_uri(self.tracking_uri),  # on disk without credentials; `sync` gets them from MLflow's variables
            device,
            self.config_yaml,
            params,
            model_names=display_names(cfg.grid.models),
        )
        journal = Journal(self.run_dir)
        journal.write_header(header)
        tracker = SweepTracker(self.tracking_uri, header.experiment)
        sink = MlflowSink(tracker, journal, header, self.say, LeaseTimes(**self.seams.lease))
        done = sink.open(resume=not cfg.rerun)
        self._tracking = Tracking(header, journal, sink, done)
        left = None if cfg.rerun or done or sink.down else older_parent(sink.tracker, cfg)
        self.say(
            f"sweep {cfg.name}: {what_runs(planned)} on {device}; "
            f"trust_remote_code={cfg.trust_remote_code}; "
            f"MLflow {redact_uri(self.tracking_uri)} parent run {sink.parent_run_id or '(pending)'}"
        )
        if left is not None:
            self.say(left_parent_note(*left))

    def prefetch(self) -> None:
        """Hub models the pending cells need are fetched now, once per node (`driver/hub_prefetch.py`): the
        cells of one that cannot be are skipped with the reason; one the plan could not read here is planned
        again from its fetched files. The time is the parent run's `hub_fetch_s`."""
        from kvsweep.driver.hub_node_fetch import hub_settings, source_for
        from kvsweep.driver.hub_prefetch import models_to_fetch, plan_after, prefetch

        planned, done, cfg, device = self.planned, self.tracking.done, self.cfg, self.connected.device
        pending = [p for p in planned.cells if cell_id(p.cell, planned.protocol) not in done]
        models = models_to_fetch(pending, planned.problems)
        if not models:
            return
        settings, started = hub_settings(), time.monotonic()
        fetches = prefetch(models, settings, self.say, source_for(self.seams.hub), cfg.trust_remote_code, device)
        self._log_parent_metric(HUB_FETCH_S, time.monotonic() - started)
        self.hub_cache = {m: settings.cache_dir or "" for m, fetch in fetches.items() if fetch.problem is None}
        limits = plan_limits(cfg, device, self.inputs.spec)

        def replan(cell: Cell, facts: "ModelFacts") -> PlannedCell:  # from the files the nodes fetched
            return plan_cell(
                cell,
                device,
                facts.shape,
                parameters=facts.planned_parameters,
                device_bytes=limits.device_bytes,
                skip_predicted_oom=cfg.planner.skip_predicted_oom,
                host=limits.host,
                gpus=limits.gpus,
                layout=facts.layout,
            )

        after, problems = plan_after(pending, planned.problems, fetches, replan if planned.searches is None else None)
        by_id = dict(zip(map(id, pending), after, strict=True))
        self._planned = replace(planned, cells=[by_id.get(id(p), p) for p in planned.cells], problems=problems)
        if planned.searches is not None:  # a search's first probes: the search plans from its own copy
            planned.searches.planned.update({cell_id(p.cell, planned.protocol): p for p in after})
        else:
            text = plan_text(self.planned.cells, problems, device, limits)
            (self.run_dir / "plan.txt").write_text(redact_text(text))

    def _log_parent_metric(self, name: str, value: float) -> None:
        """A metric of the sweep's parent run, outside every cell (told, not fatal, when MLflow is down)."""
        sink = self.tracking.sink
        try:
            if sink.parent_run_id is None:
                raise RuntimeError("no parent run yet")
            sink.tracker.client.log_metric(sink.parent_run_id, name, value)
        except Exception as exc:  # MLflow down: the sweep goes on without this one number
            self.say(f"{name}={value:.1f} not logged on the parent run ({first_line(exc)})")

    def prebuild(self) -> None:
        """Native extensions the pending cells need (quanto's CUDA kernels) are built now, once per node."""
        from kvsweep.driver.native_builds import prebuild

        planned, done = self.planned, self.tracking.done
        pending = [p for p in planned.cells if cell_id(p.cell, planned.protocol) not in done]
        after = dict(zip(map(id, pending), prebuild(pending, self.connected.device, self.say), strict=True))
        self._planned = replace(planned, cells=[after.get(id(p), p) for p in planned.cells])
        if planned.searches is not None:  # a search's first probes: the search plans from its own copy
            planned.searches.planned.update({cell_id(p.cell, planned.protocol): p for p in after.values()})

    def queue(self) -> list["Job"]:
        """Resume what has results, record what will not run, and queue the rest (small cells first)."""
        from kvsweep.driver.scheduler import Job

        planned, tracking = self.planned, self.tracking
        done, problems = tracking.done, planned.problems
        if planned.searches is not None:
            self._progress = SweepProgress(0, 0, self.out, tracking.header.model_names)
            return self._queue_searches(planned.searches)
        to_run = sum(p.runs and p.cell.model not in problems for p in planned.cells)
        progress = SweepProgress(len(planned.cells), to_run, self.out, tracking.header.model_names)
        self._progress = progress
        jobs: list[Job] = []
        for p in planned.cells:
            cid = cell_id(p.cell, planned.protocol)
            if cid in done:
                self.results.append(done[cid])
                self.pruner.observe(done[cid])
                progress.resumed(done[cid], counts_as_run=p.runs)
            elif p.cell.model in problems:
                self.record(CellResult(cid, p.cell, ERROR, error=problems[p.cell.model]), ran=False)
            elif not p.runs:
                self.record(CellResult(cid, p.cell, SKIPPED, error=p.skip_reason or ""), ran=False)
            else:
                jobs.append(Job(cid, p.cell, host_memory_bytes=p.offload.host_bytes if p.offload else 0))
        if done:
            self.say(
                f"resuming: {len(done)} of {len(planned.cells)} cells already have results in parent run "
                f"{tracking.sink.parent_run_id}; rerun=true starts afresh"
            )
        return sorted(jobs, key=size_order)  # small before large, so an OOM can spare the larger cells

    def _queue_searches(self, searches: "CapacitySearches") -> list["Job"]:
        """Each search's first probe to run, after replaying what an earlier run measured (resume)."""
        planned, progress, done = self.planned, self.progress, self.tracking.done
        replayed: list[CellResult] = []

        def skipped(result: CellResult) -> None:
            progress.expect(1, 0)
            self.record(result, ran=False)

        def resumed(result: CellResult) -> None:
            replayed.append(result)
            progress.expect(1, 0)
            self.results.append(result)
            self.pruner.observe(result)
            progress.resumed(result, counts_as_run=False)

        for p in planned.cells:  # a model that cannot be read: its searches end at their first probe
            cid = cell_id(p.cell, planned.protocol)
            if p.cell.model in planned.problems and cid not in done:
                searches.known[cid] = CellResult(cid, p.cell, ERROR, error=planned.problems[p.cell.model])
                progress.expect(1, 0)
                self.record(searches.known[cid], ran=False)
        jobs = searches.start(done, skipped, resumed)
        progress.expect(len(jobs), len(jobs))
        if replayed:
            self.say(f"resuming: {len(replayed)} probes already have results; rerun=true starts afresh")
        return jobs

    def follow_up(self, result: CellResult) -> list["Job"]:
        """A capacity search's next probes after this result (none in a plain sweep)."""
        searches = self.planned.searches
        if searches is None:
            return []
        jobs = searches.follow_up(result)
        self.progress.expect(len(jobs), len(jobs))
        return jobs

    def planned_cell(self, cid: str) -> PlannedCell:
        """A cell's plan: from the sweep's plan, or a search's probe planned as the search asked for it."""
        searches = self.planned.searches
        if searches is not None and cid in searches.planned:
            return searches.planned[cid]
        return self.planned.by_id[cid]

    def record(self, result: CellResult, ran: bool = True) -> None:
        """One result: redacted, journaled (on disk before MLflow sees it), then sent and shown."""
        progress, tracking, searches = self.progress, self.tracking, self.planned.searches
        result.metrics.update(predicted_metrics(self.planned_cell(result.cell_id)))
        if searches is not None and (axes := searches.tag_value(result.cell_id)):
            result.tags[ResultTag.SEARCH] = axes
            result.metrics.update(searches.probe_metrics(result.cell_id))
        result.error, result.traceback = redact_text(result.error), redact_text(result.traceback)
        result.cell = replace(result.cell, model=redact_text(result.cell.model))
        result.tags.update(shape_only_tags(result.cell.model))
        software = self._connected.software if self._connected else None
        if software is not None and (node := result.environment.get("ray_node_id")):
            result.environment.update(software.cell_environment(str(node)))  # its node's software and GPU model
        reason = self.inputs.reasons.get(result.cell.model)
        if reason:
            result.tags[ResultTag.INPUTS_REASON] = redact_text(reason)
        self.results.append(result)
        tracking.journal.append(result)
        self.pruner.observe(result)
        tracking.sink.finished(result)
        progress.finished(result, ran)

    def schedule(self, jobs: list["Job"]) -> int | None:
        """Runs the queued cells; on SIGINT/SIGTERM kills them, keeps what finished, returns the exit code."""
        from kvsweep.caches import registered_beyond_built_ins
        from kvsweep.driver.ray_session import send_strategies_by_value
        from kvsweep.driver.scheduler import CellScheduler, Job, Limits

        progress, ray_cfg, connected, tracking = self.progress, self.cfg.ray, self.connected, self.tracking
        sink, journal = tracking.sink, tracking.journal
        limits = Limits(
            needs=connected.needs,
            max_concurrent=max_concurrent(
                ray_cfg.max_concurrent, connected.device, connected.session.gpus, ray_cfg.gpus_per_cell
            ),
            cell_timeout_s=ray_cfg.cell_timeout_s,
            max_retries=ray_cfg.max_retries,
            prestart=ray_cfg.prestart,
        )
        options = {
            "trust_remote_code": self.cfg.trust_remote_code,
            "wait_idle_gpu_s": self.cfg.measure.wait_for_idle_gpu_s,
            "strategies": send_strategies_by_value(registered_beyond_built_ins()),  # an actor knows the built-ins
            "hub_cache": self.hub_cache,  # fetched Hub models: each cell loads them from the cache, offline
        }
        scheduler = CellScheduler(
            self.planned.protocol.to_dict(), limits, self.seams.to_dict(), options, templates=connected.templates
        )
        if scheduler.template_problem:
            self.say(f"no warm template ({scheduler.template_problem}); each cell imports in its own process")

        def started(job: Job) -> None:
            progress.started(job.cell_id, job.cell)
            sink.started(job.cell_id, job.cell)

        interrupts = SignalInterrupts()
        try:
            with interrupts, progress.shown():
                scheduler.run(
                    jobs,
                    self.record,
                    started,
                    self.pruner.admit,
                    on_wait=lambda job, text: self.say(text),
                    follow_up=self.follow_up,
                )
        except KeyboardInterrupt:
            with interrupts_ignored():
                killed = scheduler.kill_all()
                sink.interrupt([(job.cell_id, job.cell) for job in killed])
                journal.write_end("KILLED", progress.counts_by_status())
            self.say(
                f"\ninterrupted ({interrupts.name}): {len(killed)} running cells killed; {len(self.results)} "
                f"results kept in {journal.path}. Run the same command again to resume."
            )
            return interrupts.exit_code
        return None


def older_parent(tracker: "SweepTracker", cfg: KvSweepConfig) -> tuple[int, str] | None:
    """The parent an earlier kvsweep measured this sweep under (its revision and run id), not resumed: the first
    lines say so. None when there is none, or MLflow cannot say (the sink reports an MLflow problem itself)."""
    try:
        for revision, key in earlier_revisions(cfg):
            if (found := tracker.find_sweep(key)) is not None:
                return revision, found
    except Exception:  # only a note: an unreachable MLflow is the sink's to report
        return None
    return None


def what_runs(planned: Planned) -> str:
    """`12 cells`, or for a capacity search `8 capacity searches` (their probes are not known yet)."""
    if planned.searches is not None:
        return f"{len(planned.searches.searches)} capacity searches (probes chosen as results come)"
    return f"{len(planned.cells)} cells"


def max_concurrent(configured: int, device: str, gpus: float, gpus_per_cell: int) -> int:
    """Default: one cell per GPU group on CUDA; on CPU one at a time so timings do not interfere."""
    if configured > 0:
        return configured
    return max(1, int(gpus // gpus_per_cell)) if device == "cuda" else 1
