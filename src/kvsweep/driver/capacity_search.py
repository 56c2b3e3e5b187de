"""The capacity searches of a sweep: each frontier's probes, one after another, every frontier at once.

Each frontier is a `Stepping` (capacity/search_steps.py) started at the planner's predicted boundary. A probe
is an ordinary cell (its own actor and process, journal, MLflow child run), so everything cells get
holds for probes: an OOM is a result, a larger probe of a family that ran out of memory is inferred,
and a resumed sweep replays each search through the results it already has, measuring none twice.
Probes of one frontier run in order (the next depends on this one); different frontiers' probes queue
side by side and spread over the GPUs. Two frontiers that want the same cell (a batch search at context
C and a context search at batch B meet at (C, B)) share one probe.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from kvsweep.capacity.frontier import (
    BATCH,
    CONTEXT,
    MEMORY,
    FrontierKey,
    SearchSettings,
    Slo,
    ceiling,
    probe_verdict,
    unit,
)
from kvsweep.capacity.search_steps import Stepping, aim, start_of
from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.actor_placement import Job
from kvsweep.grid import Cell, MeasureProtocol, cell_id, expand_grid
from kvsweep.models.facts import ModelFacts
from kvsweep.names import Metric
from kvsweep.plan.cell_plan import PlannedCell, memory_budget, plan_cell, predicted_boundary, predicted_step_bytes
from kvsweep.plan.offload import offload_problem
from kvsweep.plan.sweep_plan import PlanLimits, model_facts
from kvsweep.results import SKIPPED, CellResult
from kvsweep.units import GB


def search_settings(cfg: KvSweepConfig) -> SearchSettings:
    search = cfg.search
    return SearchSettings(
        Slo(cfg.slo.tpot_ms, cfg.slo.ttft_ms), search.max_batch, search.context_step, search.max_context
    )


def frontier_keys(cfg: KvSweepConfig, inputs_by_model: dict[str, str]) -> list[FrontierKey]:
    """Batch searches at each grid context, context searches at each grid batch size (deduplicated)."""
    grid, keys = asdict(cfg.grid), dict[FrontierKey, None]()
    for cell in expand_grid({**grid, "batch_sizes": [1]}, inputs_by_model) if cfg.search.batch else []:
        keys.setdefault(FrontierKey.of(cell, BATCH))
    for cell in expand_grid({**grid, "context_lengths": [1]}, inputs_by_model) if cfg.search.contexts else []:
        keys.setdefault(FrontierKey.of(cell, CONTEXT))
    return list(keys)


@dataclass
class Search:
    """One frontier being searched: where it stands and the probe it waits for."""

    key: FrontierKey
    stepping: Stepping
    step: int
    predicted: int | None  # the planner's boundary, in the axis's units (tokens for a context search)
    top: int  # the ceiling, in the axis's units
    slope: Callable[[int], float | None] = lambda value: None  # the planner's bytes per step at a value
    probed: set[str] = field(default_factory=set)  # cell ids of every probe it asked for
    results: dict[int, CellResult] = field(default_factory=dict)  # its probes' results, by value in steps

    def probe_metrics(self) -> dict[str, float]:
        """Stamped on every probe of this search, so the frontier can be rebuilt from results alone."""
        metrics: dict[str, float] = {}
        if self.key.axis == CONTEXT:
            metrics[Metric.SEARCH_MAX_CONTEXT] = float(self.top)
            if self.predicted is not None:
                metrics[Metric.PREDICTED_MAX_CONTEXT] = float(self.predicted)
        elif self.predicted is not None:
            metrics[Metric.PREDICTED_MAX_BATCH] = float(self.predicted)
        return metrics


@dataclass
class CapacitySearches:
    """Every search of a sweep; turns each probe's result into the next probes to run.

    `plan_probe` plans a probe cell as any cell is planned (a predicted OOM still runs: it is what the
    search measures); `record` takes a probe the plan skips (it is recorded without running)."""

    searches: list[Search]
    settings: SearchSettings
    protocol: MeasureProtocol
    plan_probe: Callable[[Cell], PlannedCell]
    planned: dict[str, PlannedCell] = field(default_factory=dict)  # every probe asked for, by cell id
    axes: dict[str, set[str]] = field(default_factory=dict)  # cell id -> the searches that asked for it
    known: dict[str, CellResult] = field(default_factory=dict)  # results this run has: resumed or measured
    waiting: dict[str, list[Search]] = field(default_factory=dict)  # probes in flight -> who waits for them
    budget: int | None = None  # the memory a probe may use, that predictions and readings fit to; None: unknown

    @classmethod
    def build(
        cls,
        cfg: KvSweepConfig,
        keys: list[FrontierKey],
        facts: dict[str, ModelFacts],
        budget: int | None,
        protocol: MeasureProtocol,
        plan_probe: Callable[[Cell], PlannedCell],
        device: str,
    ) -> "CapacitySearches":
        settings = search_settings(cfg)
        searches = []

        def runs(cell: Cell) -> bool:
            return plan_probe(cell).runs

        for key in keys:
            fact = facts.get(key.model)
            step, top = unit(key, settings), ceiling(key, settings, fact.shape.max_positions if fact else None)
            predicted = predicted_boundary(key, fact, budget, top, step, runs, protocol.gpus)
            readings = (device == "cuda" and budget is not None) or bool(settings.slo.describe())
            stepping = Stepping(top // step, start_of(predicted, step), halve_down=readings)
            slope = predicted_step_bytes(key, fact, step, protocol.gpus)
            searches.append(Search(key, stepping, step, predicted, top, slope))
        return cls(searches, settings, protocol, plan_probe, budget=budget)

    def first_probes(self) -> list[PlannedCell]:
        """Each search's first probe, planned: what the sweep's plan shows and native builds are made for."""
        return [self._plan(s, s.stepping.start) for s in self.searches]

    def start(
        self,
        done: dict[str, CellResult],
        record: Callable[[CellResult], None],
        resumed: Callable[[CellResult], None],
    ) -> list[Job]:
        """The first probes to run: each search replays the results `done` has (a resumed sweep), then asks.
        `record` takes a probe the plan skips; `resumed` each earlier result a search replays (once each)."""
        self._done, self._record, self._resumed = dict(done), record, resumed
        return [job for search in self.searches for job in self._advance(search)]

    def follow_up(self, result: CellResult) -> list[Job]:
        """The probes that follow this result (none if it was not a probe or its searches are done)."""
        self.known[result.cell_id] = result
        waiters = self.waiting.pop(result.cell_id, [])
        return [job for search in waiters for job in self._advance(search)]

    def tag_value(self, cid: str) -> str:
        """`kvsweep.search`: the searches that asked for this probe (`batch`, `context`, `batch+context`)."""
        return "+".join(sorted(self.axes.get(cid, ())))

    def probe_metrics(self, cid: str) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for search in self.searches:
            if cid in search.probed:
                metrics |= search.probe_metrics()
        return metrics

    @property
    def expected_probes(self) -> int:
        """Probes the predicted searches take if every prediction is right: two per frontier (one at the top)."""
        return sum(1 if s.stepping.start * s.step >= s.top else 2 for s in self.searches if s.predicted is not None)

    def _plan(self, search: Search, value: int) -> PlannedCell:
        cell = search.key.cell(value * search.step)
        cid = cell_id(cell, self.protocol)
        if cid not in self.planned:
            self.planned[cid] = self.plan_probe(cell)
        self.axes.setdefault(cid, set()).add(search.key.axis)
        search.probed.add(cid)
        return self.planned[cid]

    def _advance(self, search: Search) -> list[Job]:
        """Record what is known and ask for the next probe, until one must run (a job) or the search is done."""
        while (value := search.stepping.next_value()) is not None:
            planned = self._plan(search, value)
            cid = cell_id(planned.cell, self.protocol)
            if cid not in self.known and cid in self._done:
                self.known[cid] = self._done[cid]
                self._resumed(self._done[cid])
            if cid not in self.known and cid not in self.waiting and not planned.runs:
                self.known[cid] = CellResult(cid, planned.cell, SKIPPED, error=planned.skip_reason or "")
                self._record(self.known[cid])
            if cid in self.known:
                verdict = probe_verdict(self.known[cid], self.settings.slo)
                search.results[value] = self.known[cid]
                aimed = aim(search.results, self.settings.slo, self.budget, search.slope)
                search.stepping.record(
                    value, verdict.passes, aimed if verdict.passes or verdict.limit != MEMORY else None
                )
                search.stepping.stopped = not verdict.decisive
                continue
            first_asker = cid not in self.waiting
            self.waiting.setdefault(cid, []).append(search)
            if not first_asker:
                return []  # another search already queued this probe
            offload = planned.offload
            return [Job(cid, planned.cell, host_memory_bytes=offload.host_bytes if offload else 0)]
        return []

    def __post_init__(self) -> None:
        self._done: dict[str, CellResult] = {}  # an earlier run's results (resume)
        self._record: Callable[[CellResult], None] = lambda result: None
        self._resumed: Callable[[CellResult], None] = lambda result: None


def plan_searches(
    cfg: KvSweepConfig, device: str, limits: PlanLimits, protocol: MeasureProtocol, inputs_by_model: dict[str, str]
) -> tuple[CapacitySearches, dict[str, str]]:
    """The sweep's searches, each started at its predicted boundary, and the models that cannot be read."""
    facts, problems = model_facts(cfg.grid.models, cfg.trust_remote_code, cfg.grid.weights)
    budget = memory_budget(device, limits.device_bytes, cfg.measure.device_memory_limit_gb)

    def plan_probe(cell: Cell) -> PlannedCell:
        """Planned as any cell, but a predicted device OOM still runs: where memory runs out is what a search
        measures. An offloaded probe that cannot finish in time or pin its blocks is skipped, as in a grid."""
        fact = facts.get(cell.model)
        planned = plan_cell(
            cell,
            device,
            fact.shape if fact else None,
            parameters=fact.planned_parameters if fact else None,
            device_bytes=limits.device_bytes,
            skip_predicted_oom=False,
            host=limits.host,
            gpus=limits.gpus,
            layout=fact.layout if fact else None,
        )
        host = limits.host
        if planned.runs and planned.offload is not None and cfg.planner.skip_predicted_oom:
            planned = replace(planned, skip_reason=offload_problem(planned.offload, host.timeout_s, host.memory_bytes))
        return planned

    keys = frontier_keys(cfg, inputs_by_model)
    return CapacitySearches.build(cfg, keys, facts, budget, protocol, plan_probe, device), problems


def search_lines(cfg: KvSweepConfig) -> list[str]:
    """What the run's first lines say a search does with the grid: which axis it replaces, at which sizes."""
    grid, lines = cfg.grid, []
    if cfg.search.batch:
        unused = "" if cfg.search.contexts else f"; grid.batch_sizes {grid.batch_sizes} not used"
        lines.append(
            f"search.batch: the largest batch up to {cfg.search.max_batch} at each of grid.context_lengths "
            f"{grid.context_lengths}{unused}"
        )
    if cfg.search.contexts:
        unused = "" if cfg.search.batch else f"; grid.context_lengths {grid.context_lengths} not used"
        lines.append(
            f"search.contexts: the longest context (a multiple of {cfg.search.context_step}) at each of "
            f"grid.batch_sizes {grid.batch_sizes}{unused}"
        )
    return lines


def search_text(searches: CapacitySearches) -> list[str]:
    """The dry run's and plan.txt's account of each search: where it starts, how far it may go, what it expects."""
    budget, slo = searches.budget, searches.settings.slo.describe()
    head = f"{len(searches.searches)} capacity searches" + (f"; SLO {slo}" if slo else "")
    unpredicted = sum(s.predicted is None for s in searches.searches)
    if budget is None:
        head += (
            "; memory budget unknown (no GPU figure, no measure.device_memory_limit_gb): each starts at 1 and doubles"
        )
    else:
        head += f"; memory budget {budget / GB:.2f} GB; {searches.expected_probes} probes if every prediction holds"
        head += " (more where one is off)"
        if unpredicted:
            head += f"; {unpredicted} searches without a prediction start at 1 and double"
    lines = [head]
    for s in searches.searches:
        key, what = s.key, "max batch" if s.key.axis == BATCH else "max context"
        at = f"ctx{key.fixed}" if key.axis == BATCH else f"bs{key.fixed}"
        predicted = "unknown" if s.predicted is None else str(s.predicted)
        label = f"{key.strategy} {at} {key.dtype} {key.model} new{key.max_new_tokens}"
        lines.append(
            f"  {label:58s} predicted {what} {predicted} (up to {s.top}); first probe {s.stepping.start * s.step}"
        )
    return lines
