"""The grid as a source of jobs, without Ray: what it replays, records and queues, and in which order."""

from dataclasses import dataclass, field

from kvsweep.driver.job_sources import GridJobs
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.results import ERROR, OK, SKIPPED, CellResult

PROTOCOL = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)


def cell(context: int, batch: int = 1, model: str = "tiny-llama") -> Cell:
    return Cell(model, "float32", context, batch, 8, "dynamic", False)


@dataclass
class Book:
    """What the sweep is told, in order."""

    parent_run_id: str | None = "parent-1"
    told: list[tuple[str, str]] = field(default_factory=list)
    expected: list[tuple[int, int]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def record(self, result: CellResult, ran: bool = True) -> None:
        self.told.append(("record", result.status))

    def resumed(self, result: CellResult, counts_as_run: bool) -> None:
        self.told.append(("resumed", result.status))

    def expect(self, cells: int, runs: int) -> None:
        self.expected.append((cells, runs))

    def say(self, text: str) -> None:
        self.lines.append(text)


def test_the_grid_replays_what_ran_records_what_cannot_run_and_queues_the_rest_small_first():
    large, small, done_cell = cell(512, 2), cell(64), cell(128)
    skipped, unreadable = cell(256), cell(64, model="no/such-model")
    planned = [
        PlannedCell(large, None),
        PlannedCell(done_cell, None),
        PlannedCell(skipped, "static layouts only"),
        PlannedCell(unreadable, None),
        PlannedCell(small, None),
    ]
    source = GridJobs(PROTOCOL, planned, {"no/such-model": "no such model"})
    done = {cell_id(done_cell, PROTOCOL): CellResult(cell_id(done_cell, PROTOCOL), done_cell, OK)}
    book = Book()

    jobs = source.start(done, book)

    assert [job.cell for job in jobs] == [small, large]  # 64 x 1 tokens before 520 x 2
    assert book.told == [("resumed", OK), ("record", SKIPPED), ("record", ERROR)]  # in the plan's order
    assert book.expected == [(5, 3)]  # five cells; the skipped and the unreadable ones do not run
    assert book.lines == [
        "resuming: 1 of 5 cells already have results in parent run parent-1; rerun=true starts afresh"
    ]
    assert source.follow_up(CellResult(jobs[0].cell_id, small, OK)) == []  # a grid asks for nothing more
    assert source.planned_cell(cell_id(skipped, PROTOCOL)).skip_reason == "static layouts only"


def test_cells_planned_again_replace_their_plan_and_the_problems():
    first, second = cell(64), cell(128)
    source = GridJobs(PROTOCOL, [PlannedCell(first, None), PlannedCell(second, None)], {})
    pending = source.pending({})
    replanned = [PlannedCell(first, "fetched: gated"), pending[1]]
    source.replace(pending, replanned, {"other": "unreadable"})
    assert source.planned_cell(cell_id(first, PROTOCOL)).skip_reason == "fetched: gated"
    assert source.problems == {"other": "unreadable"} and len(source.cells) == 2
