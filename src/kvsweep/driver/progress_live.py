"""The live progress display on a terminal, drawn with rich (driver only; imported only on a TTY).

A bar with done/total, the counts by status, running/left, elapsed and ETA, then one row per
running cell with how long it has run. Redrawn a few times a second; messages print above it.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from kvsweep.driver.progress import SweepProgress, clock

REFRESH_PER_S = 4


def render(progress: SweepProgress, now: float) -> RenderableType:
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
    console = Console(file=progress.stream, force_terminal=True, highlight=False)
    with Live(
        get_renderable=lambda: render(progress, time.monotonic()),
        console=console,
        refresh_per_second=REFRESH_PER_S,
    ) as live:
        yield lambda text: live.console.print(text, markup=False, highlight=False, soft_wrap=True)
