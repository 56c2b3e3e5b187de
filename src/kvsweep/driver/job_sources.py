"""Where a sweep's jobs come from: the plain grid, or the capacity searches. One interface, two sources.

A source holds the cells planned before anything runs (`plan.txt`, the Hub prefetch and native builds work on
them), says which jobs to run first (after replaying an earlier run's results) and what a finished result asks to
run next, so the sweep never asks which kind it is; a new kind of job (a request-mix workload) is a third source.
OOM inference (`OomPruner`): a family's OOM implies it for every cell at least as large on each size axis, recorded
`oom` with `kvsweep.inferred=true` instead of run, which is why jobs run small to large (`size_order`).
"""

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar, Protocol

from kvsweep.driver.scheduler import Job
from kvsweep.grid import Cell, MeasureProtocol, cell_id, run_order
from kvsweep.names import ResultTag
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.plan.sweep_plan import plan_text
from kvsweep.results import ERROR, OOM, SKIPPED, CellResult

SIZE_AXES = ("batch_size", "context_length", "max_new_tokens")
FAMILY = ("model", "dtype", "cache", "compile")


def size_order(job: Job) -> tuple[int, int]:
    return run_order(job.cell)


class OomPruner:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.out_of_memory: list[tuple[Cell, str]] = []  # (cell, oom kind)

    def observe(self, result: CellResult) -> None:
        if result.status == OOM and result.tags.get(ResultTag.INFERRED) != "true":
            self.out_of_memory.append((result.cell, result.tags.get(ResultTag.OOM_KIND, "device")))

    def admit(self, job: Job) -> CellResult | None:
        """None: run it. A result: it is known to run out of memory."""
        if not self.enabled:
            return None
        for smaller, kind in self.out_of_memory:
            same_family = all(getattr(job.cell, k) == getattr(smaller, k) for k in FAMILY)
            if same_family and all(getattr(job.cell, k) >= getattr(smaller, k) for k in SIZE_AXES):
                cause = f"ctx={smaller.context_length} bs={smaller.batch_size} new={smaller.max_new_tokens}"
                return CellResult(
                    job.cell_id,
                    job.cell,
                    OOM,
                    error=f"inferred: the smaller cell {cause} already ran out of memory",
                    tags={ResultTag.INFERRED: "true", ResultTag.OOM_KIND: kind},
                )
        return None


if TYPE_CHECKING:
    from kvsweep.driver.capacity_search import CapacitySearches
    from kvsweep.driver.scheduler import Job
    from kvsweep.plan.sweep_plan import PlanLimits


class Book(Protocol):
    """What a source tells the sweep as it starts: a result it records without running (a planned skip, a model
    that cannot be read), an earlier run's result it replays, and cells it adds to the count."""

    parent_run_id: str | None  # where the replayed results were found

    def record(self, result: CellResult, ran: bool = True) -> None: ...
    def resumed(self, result: CellResult, counts_as_run: bool) -> None: ...
    def expect(self, cells: int, runs: int) -> None: ...
    def say(self, text: str) -> None: ...


class JobSource(Protocol):
    """What the sweep asks of a source of jobs."""

    protocol: MeasureProtocol
    cells: list[PlannedCell]  # planned before anything runs
    problems: dict[str, str]  # model -> why none of its cells can run
    replans_after_fetch: ClassVar[bool]  # whether a Hub model fetched for it is planned again from its files

    def describe(self) -> str: ...
    def plan_text(self, device: str, limits: "PlanLimits") -> str: ...
    def pending(self, done: dict[str, CellResult]) -> list[PlannedCell]: ...
    def replace(self, before: list[PlannedCell], after: list[PlannedCell], problems: dict[str, str]) -> None: ...
    def start(self, done: dict[str, CellResult], book: Book) -> list["Job"]: ...
    def follow_up(self, result: CellResult) -> list["Job"]: ...
    def planned_cell(self, cid: str) -> PlannedCell: ...
    def annotate(self, result: CellResult) -> None: ...


@dataclass
class GridJobs:
    """Every cell of the grid, planned up front; a result asks for nothing more."""

    protocol: MeasureProtocol
    cells: list[PlannedCell]
    problems: dict[str, str]  # model -> why none of its cells can run
    replans_after_fetch: ClassVar[bool] = True  # a Hub model the driver could not read is planned from its files

    @cached_property
    def _by_id(self) -> dict[str, PlannedCell]:
        return {cell_id(p.cell, self.protocol): p for p in self.cells}

    def describe(self) -> str:
        return f"{len(self.cells)} cells"

    def plan_text(self, device: str, limits: "PlanLimits") -> str:
        return plan_text(self.cells, self.problems, device, limits)

    def pending(self, done: dict[str, CellResult]) -> list[PlannedCell]:
        """The planned cells no earlier run measured."""
        return [p for p in self.cells if cell_id(p.cell, self.protocol) not in done]

    def replace(self, before: list[PlannedCell], after: list[PlannedCell], problems: dict[str, str]) -> None:
        """The cells `before` planned again as `after` (a Hub fetch, a native build), and the models' problems."""
        by_id = dict(zip(map(id, before), after, strict=True))
        self.cells = [by_id.get(id(p), p) for p in self.cells]
        self.problems = problems
        self.__dict__.pop("_by_id", None)

    def start(self, done: dict[str, CellResult], book: Book) -> list["Job"]:
        """Replay what has results, record what will not run, and queue the rest (small cells first)."""
        from kvsweep.driver.scheduler import Job

        book.expect(len(self.cells), sum(p.runs and p.cell.model not in self.problems for p in self.cells))
        jobs: list[Job] = []
        for p in self.cells:
            cid = cell_id(p.cell, self.protocol)
            if cid in done:
                book.resumed(done[cid], counts_as_run=p.runs)
            elif p.cell.model in self.problems:
                book.record(CellResult(cid, p.cell, ERROR, error=self.problems[p.cell.model]), ran=False)
            elif not p.runs:
                book.record(CellResult(cid, p.cell, SKIPPED, error=p.skip_reason or ""), ran=False)
            else:
                jobs.append(Job(cid, p.cell, host_memory_bytes=p.offload.host_bytes if p.offload else 0))
        if done:
            book.say(
                f"resuming: {len(done)} of {len(self.cells)} cells already have results in parent run "
                f"{book.parent_run_id}; rerun=true starts afresh"
            )
        return sorted(jobs, key=size_order)  # small before large, so an OOM can spare the larger cells

    def follow_up(self, result: CellResult) -> list["Job"]:
        return []

    def planned_cell(self, cid: str) -> PlannedCell:
        return self._by_id[cid]

    def annotate(self, result: CellResult) -> None:
        """What the source adds to a result before it is recorded (nothing: a grid cell is just a cell)."""


@dataclass
class SearchJobs(GridJobs):
    """Capacity searches: each search's first probe is planned up front, the next ones as results come (a grid
    of first probes whose results ask for more)."""

    searches: "CapacitySearches | None" = None
    replans_after_fetch: ClassVar[bool] = False  # a search plans its probes from its own copy of the model's facts
    _replayed: int = field(default=0, init=False)

    @property
    def _searches(self) -> "CapacitySearches":
        assert self.searches is not None, "a SearchJobs is built with its searches"
        return self.searches

    def describe(self) -> str:
        return f"{len(self._searches.searches)} capacity searches (probes chosen as results come)"

    def plan_text(self, device: str, limits: "PlanLimits") -> str:
        from kvsweep.driver.capacity_search import search_text

        return "\n".join(search_text(self._searches)) + "\n\nfirst probes: " + super().plan_text(device, limits)

    def replace(self, before: list[PlannedCell], after: list[PlannedCell], problems: dict[str, str]) -> None:
        super().replace(before, after, problems)
        self._searches.planned.update({cell_id(p.cell, self.protocol): p for p in after})

    def start(self, done: dict[str, CellResult], book: Book) -> list["Job"]:
        """Each search's first probe to run, after replaying what an earlier run measured (resume)."""
        searches = self._searches

        def skipped(result: CellResult) -> None:
            book.expect(1, 0)
            book.record(result, ran=False)

        def resumed(result: CellResult) -> None:
            self._replayed += 1
            book.expect(1, 0)
            book.resumed(result, counts_as_run=False)

        for p in self.cells:  # a model that cannot be read: its searches end at their first probe
            cid = cell_id(p.cell, self.protocol)
            if p.cell.model in self.problems and cid not in done:
                searches.known[cid] = CellResult(cid, p.cell, ERROR, error=self.problems[p.cell.model])
                book.expect(1, 0)
                book.record(searches.known[cid], ran=False)
        jobs = searches.start(done, skipped, resumed)
        book.expect(len(jobs), len(jobs))
        if self._replayed:
            book.say(f"resuming: {self._replayed} probes already have results; rerun=true starts afresh")
        return jobs

    def follow_up(self, result: CellResult) -> list["Job"]:
        return self._searches.follow_up(result)

    def planned_cell(self, cid: str) -> PlannedCell:
        """A probe planned as its search asked for it, or one of the first probes."""
        return self._searches.planned.get(cid) or super().planned_cell(cid)

    def annotate(self, result: CellResult) -> None:
        """The searches that asked for the probe (`kvsweep.search`) and where each stood."""
        if axes := self._searches.tag_value(result.cell_id):
            result.tags[ResultTag.SEARCH] = axes
            result.metrics.update(self._searches.probe_metrics(result.cell_id))
