"""Sweep progress: cells done/running/left by status, elapsed time, ETA, and which cells are running.

On a terminal a live display (`live_display`, rich, imported only then) redraws in place a few times a second: a
bar, the counts, and each running cell with how long it has run; failures print above it. In a log or CI (no TTY)
every finished cell is one appended line, as `tail -f` and grep expect. Driver only.
"""

import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from kvsweep.grid import Cell, cell_label
from kvsweep.names import Metric
from kvsweep.results import OK, SKIPPED, STATUSES, CellResult

if TYPE_CHECKING:
    from rich.console import RenderableType


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class SweepProgress:
    def __init__(
        self,
        total: int,
        to_run: int,
        stream: TextIO | None = None,
        model_names: dict[str, str] | None = None,
        live: bool | None = None,
    ) -> None:
        self.total = total
        self.to_run = to_run
        self.stream = stream or sys.stdout
        self.model_names = model_names or {}
        self.live = _is_terminal(self.stream) if live is None else live
        self.started_at = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.running: dict[str, tuple[str, float]] = {}  # cell id -> (label, started at)
        self.measured = 0  # cells that ran (not planned skips), for the ETA
        self.forecasts: dict[str, float] = {}  # cell id -> forecast seconds of the cells still to run
        self.slots = 1  # cells at a time, for a forecast ETA
        self.ratios: list[float] = []  # cell_wall_s / forecast of the cells that finished in this run
        self._print = self._print_line  # the live display swaps in its own while it is shown

    def forecast(self, seconds_by_cell: dict[str, float], slots: int) -> None:
        """The ETA from here on is the remaining cells' forecast, scaled by what finished cells took against
        theirs, over `slots` cells at a time (and from the very start, before any cell finished)."""
        self.forecasts, self.slots = dict(seconds_by_cell), max(1, slots)

    def label(self, cell: Cell) -> str:
        return cell_label(cell, self.model_names.get(cell.model, ""))

    def started(self, cell_id: str, cell: Cell) -> None:
        self.running[cell_id] = (self.label(cell), time.monotonic())

    def finished(self, result: CellResult, ran: bool = True) -> None:
        self.counts[result.status] += 1
        forecast = self.forecasts.pop(result.cell_id, None)
        if ran:
            self.running.pop(result.cell_id, None)
            self.measured += 1
            if forecast and result.wall_s > 0 and result.status == OK:  # a cell that failed early says nothing
                self.ratios.append(result.wall_s / forecast)
        if self.live and result.status in (OK, SKIPPED):
            return  # on a terminal the display shows it; only failures earn a line
        detail = f"tpot {result.metrics[Metric.TPOT_MS]:.2f} ms" if Metric.TPOT_MS in result.metrics else result.error
        self._print(f"{self.line()} | {result.status}: {self.label(result.cell)} {detail[:120]}")

    def expect(self, cells: int, runs: int) -> None:
        """Cells the plan did not list (a capacity search's next probes), counted once they are asked for."""
        self.total += cells
        self.to_run += runs

    def resumed(self, result: CellResult, counts_as_run: bool) -> None:
        """A result an earlier invocation already logged: counted, not printed, not in the ETA."""
        self.counts[result.status] += 1
        if counts_as_run:
            self.to_run -= 1

    def say(self, text: str) -> None:
        """A message for the user: above the live display while it is shown, else a plain line."""
        self._print(text)

    @contextmanager
    def shown(self) -> Iterator[None]:
        """The live display while cells run (a terminal only; rich is imported only then)."""
        if not self.live:
            yield
            return
        with live_display(self) as print_above:
            self._print = print_above
            try:
                yield
            finally:
                self._print = self._print_line

    def _print_line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def eta(self) -> str:
        remaining_runs = self.to_run - self.measured
        elapsed = time.monotonic() - self.started_at
        if self.forecasts and remaining_runs > 0:
            return clock(self._forecast_left(remaining_runs, elapsed))
        return "?" if self.measured == 0 else clock(elapsed / self.measured * remaining_runs)

    def _forecast_left(self, remaining_runs: int, elapsed: float) -> float:
        """The cells left, by their forecast scaled by what finished cells took against theirs (a running cell: what
        is left of it), over the slots, never less than the longest; cells without a forecast at the mean so far."""
        ratio = statistics.median(self.ratios) if self.ratios else 1.0
        now = time.monotonic()
        left = []
        for cid, seconds in self.forecasts.items():
            started = self.running.get(cid)
            left.append(max(0.0, seconds * ratio - (now - started[1] if started else 0.0)))
        unforecast = max(0, remaining_runs - len(left))
        mean = elapsed / self.measured * self.slots if self.measured else 0.0
        total = sum(left) + unforecast * mean
        return max(total / self.slots, max(left, default=0.0))

    def line(self) -> str:
        elapsed = time.monotonic() - self.started_at
        left = self.total - self.done - len(self.running)
        by_status = " ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])
        return (
            f"[{self.done}/{self.total}] {by_status} | running {len(self.running)} | left {left} | "
            f"{clock(elapsed)} elapsed | ETA {self.eta()}"
        )

    def counts_by_status(self) -> dict[str, int]:
        return {s: self.counts[s] for s in STATUSES}


def _is_terminal(stream: TextIO) -> bool:
    """A terminal that can redraw in place (not a pipe, a file, or TERM=dumb)."""
    import os

    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


REFRESH_PER_S = 4


def render(progress: SweepProgress, now: float) -> "RenderableType":
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 1))
    bar = ProgressBar(total=max(progress.total, 1), completed=progress.done, width=30)
    head.add_row(bar, Text(progress.line()))
    rows = Table.grid(padding=(0, 2))
    for label, since in sorted(progress.running.values(), key=lambda item: item[1]):
        rows.add_row(Text(f"  running {label}", style="cyan"), clock(now - since))
    return Group(head, rows)


@contextmanager
def live_display(progress: SweepProgress) -> Iterator[Callable[[str], None]]:
    """Shows the display until the block ends (also on Ctrl-C); yields how to print above it.

    Stray writes to sys.stdout/sys.stderr meanwhile (warnings, libraries) are printed above it too.
    """
    from rich.console import Console
    from rich.live import Live

    console = Console(file=progress.stream, force_terminal=True, highlight=False)
    with Live(
        get_renderable=lambda: render(progress, time.monotonic()),
        console=console,
        refresh_per_second=REFRESH_PER_S,
    ) as live:
        yield lambda text: live.console.print(text, markup=False, highlight=False, soft_wrap=True)
