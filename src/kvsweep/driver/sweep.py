"""One sweep, end to end: config -> cells -> plan -> Ray -> MLflow -> table.

`run_sweep` is the whole sequence, read top to bottom; each stage is a function that returns what the next
needs. Where the jobs come from (the grid, the capacity searches) is a job source's business (`job_sources.py`);
the sweep runs jobs and records results. This file wires the modules and owns the exit code.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.job_sources import GridJobs, JobSource, OomPruner, SearchJobs
from kvsweep.driver.progress import SweepProgress
from kvsweep.driver.sweep_finish import SignalInterrupts, finish, interrupts_ignored, lease_lost
from kvsweep.driver.sweep_tracking import Tracking, open_tracking
from kvsweep.models.presets import shape_only_tags
from kvsweep.names import FORECAST_JSON, NODE_SOFTWARE_PARAM, ResultTag
from kvsweep.node_software import SoftwareCheck
from kvsweep.plan.sweep_plan import plan_limits, plan_sweep, predicted_metrics, protocol_of, sweep_workload
from kvsweep.redact import redact_text
from kvsweep.results import CellResult
from kvsweep.testing.testing_config import Seams
from kvsweep.tracking.lease import LeaseHeld, LeaseLost

if TYPE_CHECKING:
    from kvsweep.driver.actor_placement import Templates
    from kvsweep.driver.inputs_choice import InputsChoice
    from kvsweep.driver.ray_session import CellNeeds, RaySession
    from kvsweep.driver.scheduler import Job
    from kvsweep.driver.software_survey import Survey
    from kvsweep.driver.sweep_forecast import SweepForecast
    from kvsweep.plan.sweep_plan import PlanLimits


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
    extensions, resume, run the jobs (recording each result), then the table, the report and the closing lines.
    `inputs`: the choice, when the caller made it already. Returns the exit code."""
    from kvsweep.config.tool_variables import tracking_uri
    from kvsweep.driver import ray_session
    from kvsweep.driver.first_lines import first_lines
    from kvsweep.driver.hub_prefetch import fetch_for_sweep
    from kvsweep.driver.inputs_choice import choose_inputs
    from kvsweep.driver.native_builds import prebuild
    from kvsweep.driver.ray_session import prewarm
    from kvsweep.driver.sweep_forecast import forecast_jobs, refined

    inputs, seams, say = inputs or choose_inputs(cfg), seams or Seams(), Lines(out or sys.stdout)
    uri = tracking_uri(cfg.mlflow.tracking_uri)  # composed already; absolute before Ray starts (it changes directory)
    for line in first_lines(cfg, inputs):
        say(line)
    prewarm()  # MLflow and the report's imports overlap Ray's start
    session = ray_session.connect(cfg.ray.address)
    tracking: Tracking | None = None
    try:
        cluster = connect(cfg, session, say)
        limits = plan_limits(cfg, cluster.device, inputs.spec)  # found once: on CUDA it asks the local GPUs
        source = plan_jobs(cfg, cluster.device, inputs, limits, run_dir)
        names = cluster.software.gpu_names() if cluster.software else []
        bill = forecast_jobs(cfg, cluster.device, cluster.session, source, limits, names).bill
        bill.check_budget(cfg.planner.max_gpu_hours)
        try:
            tracking = open_tracking(cfg, redact_text(config_yaml), run_dir, uri, cluster.device, source, seams, say)
        except LeaseHeld as held:  # an identical sweep is writing to the parent this one would resume
            print(f"kvsweep: {held}", file=sys.stderr, flush=True)
            return 2
        hub_cache = fetch_for_sweep(cfg, cluster.device, limits, source, tracking, seams.hub, say)
        pending = source.pending(tracking.done)
        source.replace(pending, prebuild(pending, cluster.device, say), source.problems)
        forecast = forecast_jobs(cfg, cluster.device, cluster.session, source, limits, names)  # Hub models: anew
        write_plan(source, cluster.device, limits, run_dir, forecast)
        forecast, refinement = refined(forecast, list(tracking.done.values()))
        say(forecast.bill.lines()[0] + (f"; {refinement}" if refinement else ""))
        sweep = Sweep(cfg, run_dir, inputs, tracking, source, cluster.software, say, forecast=forecast)
        jobs = source.start(tracking.done, sweep)
        try:
            interrupted = run_jobs(sweep, jobs, cluster, hub_cache, seams)
            return interrupted if interrupted is not None else finish(sweep)
        except LeaseLost as lost:  # stopped or cut off past its lease: another sweep writes to the parent now
            return lease_lost(lost, tracking.journal.path, len(sweep.results))
    finally:
        if tracking is not None:
            tracking.sink.release()  # the parent run's lease ends with the sweep, however it ends
        ray_session.shutdown(session)


class Lines:
    """Where the sweep's messages go: plain lines, then above the progress display once it shows. Redacted."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.progress: SweepProgress | None = None

    def __call__(self, text: str) -> None:
        if self.progress is None:
            print(redact_text(text), file=self.out, flush=True)
        else:
            self.progress.say(redact_text(text))


@dataclass(frozen=True)
class Cluster:
    """The cluster as the sweep found it: the device cells run on, what each needs, the warm templates."""

    session: "RaySession"
    device: str
    needs: "CellNeeds"
    templates: "Templates | None"  # None: ray.fork_cells=false, each cell measures in its own actor
    software: "Survey | None" = None  # what each node that can run a cell reported (None: not surveyed)
    slots: int = 1  # cells at once (`ray.max_concurrent`, else as many as fit on the nodes' GPUs)


def connect(cfg: KvSweepConfig, session: "RaySession", say: Callable[[str], None]) -> Cluster:
    """The device cells run on, and what each needs from the cluster (checked to fit), and the same software
    on every node that can run one (`software_survey.py`: a mismatch is exit 2 here). The warm templates
    start importing now, overlapping the plan and MLflow; the first cell waits for them."""
    from kvsweep.driver import ray_session
    from kvsweep.driver.actor_placement import launch_templates
    from kvsweep.driver.scheduler import max_concurrent
    from kvsweep.driver.software_survey import check_software

    device = ray_session.resolve_device(cfg.device, session)
    needs = ray_session.CellNeeds(
        gpus=cfg.ray.gpus_per_cell if device == "cuda" else 0,
        cpus=cfg.ray.cpus_per_cell,
        accelerator_type=cfg.ray.accelerator_type,
        resources=dict(cfg.ray.resources),
    )
    ray_session.check_fits(needs)
    software = check_software(needs, session.local, cfg.ray.allow_mixed_versions, say)
    slots = max_concurrent(cfg.ray.max_concurrent, device, session.gpus, cfg.ray.gpus_per_cell, session.node_gpus)
    return Cluster(session, device, needs, launch_templates() if cfg.ray.fork_cells else None, software, slots)


def plan_jobs(
    cfg: KvSweepConfig, device: str, inputs: "InputsChoice", limits: "PlanLimits", run_dir: Path
) -> JobSource:
    """The sweep's source of jobs, planned (the plan in the run folder's `plan.txt`): the grid's cells, or
    with `search.batch`/`search.contexts` the capacity searches and their first probes."""
    from kvsweep.driver.capacity_search import plan_searches

    protocol = protocol_of(cfg.measure, device, inputs.spec, limits.gpus, sweep_workload(cfg))
    source: JobSource
    if cfg.search.batch or cfg.search.contexts:
        searches, problems = plan_searches(cfg, device, limits, protocol, inputs.by_model)
        source = SearchJobs(protocol, searches.first_probes(), problems, searches)
    else:
        cells, problems = plan_sweep(cfg, device, limits, inputs.by_model)
        source = GridJobs(protocol, cells, problems)
    write_plan(source, device, limits, run_dir)
    return source


def write_plan(
    source: JobSource, device: str, limits: "PlanLimits", run_dir: Path, forecast: "SweepForecast | None" = None
) -> None:
    """`plan.txt` in the run folder: when planned, again once Hub models are planned, with the forecast (its bill,
    each cell's seconds; `forecast.json` beside it)."""
    from kvsweep.forecast.sweep_bill import cell_lines

    run_dir.mkdir(parents=True, exist_ok=True)
    text = source.plan_text(device, limits)
    if forecast is not None:
        text += "\n\n" + "\n".join([*forecast.bill.lines(), "", *cell_lines(forecast.bill.cells)])
        (run_dir / FORECAST_JSON).write_text(forecast.bill.to_json())
    (run_dir / "plan.txt").write_text(redact_text(text))


@dataclass
class Sweep:
    """The running sweep: its source of jobs and where each result goes, and the results so far."""

    cfg: KvSweepConfig
    run_dir: Path
    inputs: "InputsChoice"
    tracking: Tracking
    source: JobSource
    software: "Survey | None"
    say: Lines
    results: list[CellResult] = field(default_factory=list)
    forecast: "SweepForecast | None" = None  # each cell's forecast: logged beside what it took, and the ETA

    def __post_init__(self) -> None:
        self.pruner = OomPruner(self.cfg.infer_oom)
        self.progress = SweepProgress(0, 0, self.say.out, self.tracking.header.model_names)
        self.say.progress = self.progress  # messages now print above the progress display
        self.tracking_uri = self.tracking.uri
        self.parent_run_id = self.tracking.sink.parent_run_id
        if self.forecast is not None:
            seconds = {c.cell_id: c.forecast.seconds for c in self.forecast.bill.cells}
            self.progress.forecast(seconds, self.forecast.bill.slots)

    def expect(self, cells: int, runs: int) -> None:
        self.progress.expect(cells, runs)

    def resumed(self, result: CellResult, counts_as_run: bool) -> None:
        """A result an earlier run of this sweep logged: kept, counted, not measured again."""
        self.results.append(result)
        self.pruner.observe(result)
        self.progress.resumed(result, counts_as_run)

    def record(self, result: CellResult, ran: bool = True) -> None:
        """One result: redacted, journaled (on disk before MLflow sees it), then sent and shown."""
        result.metrics.update(predicted_metrics(self.source.planned_cell(result.cell_id)))
        if self.forecast is not None:
            result.metrics.update(self.forecast.metrics(result))
        self.source.annotate(result)
        result.error, result.traceback = redact_text(result.error), redact_text(result.traceback)
        result.cell = replace(result.cell, model=redact_text(result.cell.model))
        result.tags.update(shape_only_tags(result.cell.model))
        node = result.environment.get("ray_node_id")
        if self.software is not None and node and NODE_SOFTWARE_PARAM not in result.environment:
            result.environment.update(self.software.cell_environment(str(node)))  # its node's software and GPU
        if reason := self.inputs.reasons.get(result.cell.model):
            result.tags[ResultTag.INPUTS_REASON] = redact_text(reason)
        self.results.append(result)
        self.tracking.journal.append(result)
        self.pruner.observe(result)
        self.tracking.sink.finished(result)
        self.progress.finished(result, ran)

    def follow_up(self, result: CellResult) -> list["Job"]:
        """The jobs this result asks for (a capacity search's next probes), counted and forecast as they are
        asked for."""
        jobs = self.source.follow_up(result)
        self.progress.expect(len(jobs), len(jobs))
        if self.forecast is not None:
            for job in jobs:
                if (seconds := self.forecast.add(job.cell_id, job.cell)) is not None:
                    self.progress.forecasts[job.cell_id] = seconds
        return jobs


def run_jobs(sweep: Sweep, jobs: list["Job"], cluster: Cluster, hub_cache: dict[str, str], seams: Seams) -> int | None:
    """Runs the jobs (and those their results ask for); on SIGINT/SIGTERM kills them, keeps what finished,
    returns the exit code (None: every job ran)."""
    from kvsweep.caches import registered_beyond_built_ins
    from kvsweep.cell.request import RunOptions
    from kvsweep.driver.ray_session import send_strategies_by_value
    from kvsweep.driver.scheduler import CellScheduler, Job, Limits

    cfg, progress, sink, journal = sweep.cfg, sweep.progress, sweep.tracking.sink, sweep.tracking.journal
    limits = Limits(
        needs=cluster.needs,
        max_concurrent=cluster.slots,
        cell_timeout_s=cfg.ray.cell_timeout_s,
        max_retries=cfg.ray.max_retries,
        prestart=cfg.ray.prestart,
    )
    options = RunOptions(
        software=cluster.software.check if cluster.software is not None else SoftwareCheck(),
        trust_remote_code=cfg.trust_remote_code,
        strategies=tuple(send_strategies_by_value(registered_beyond_built_ins())),  # an actor knows the built-ins
        hub_cache=hub_cache,  # fetched Hub models: each cell loads them from the cache, offline
    )
    scheduler = CellScheduler(sweep.source.protocol, limits, seams, options, templates=cluster.templates)
    if scheduler.template_problem:
        sweep.say(f"no warm template ({scheduler.template_problem}); each cell imports in its own process")

    def started(job: Job) -> None:
        progress.started(job.cell_id, job.cell)
        sink.started(job.cell_id, job.cell)

    interrupts = SignalInterrupts()
    try:
        with interrupts, progress.shown():
            scheduler.run(
                jobs,
                sweep.record,
                started,
                sweep.pruner.admit,
                on_wait=lambda job, text: sweep.say(text),
                follow_up=sweep.follow_up,
            )
    except LeaseLost:
        with interrupts_ignored():
            scheduler.kill_all()  # their results would go nowhere: the parent is another sweep's
        raise
    except KeyboardInterrupt:
        with interrupts_ignored():
            killed = scheduler.kill_all()
            sink.interrupt([(job.cell_id, job.cell) for job in killed])
            journal.write_end("KILLED", progress.counts_by_status())
        sweep.say(
            f"\ninterrupted ({interrupts.name}): {len(killed)} running cells killed; {len(sweep.results)} "
            f"results kept in {journal.path}. Run the same command again to resume."
        )
        return interrupts.exit_code
    return None
