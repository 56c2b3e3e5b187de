"""A progress line per event: cells done/running/left by status, elapsed time, ETA."""

import sys
import time
from collections import Counter
from typing import TextIO

from kvsweep.results import STATUSES, CellResult


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class SweepProgress:
    def __init__(self, total: int, to_run: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.to_run = to_run
        self.stream = stream or sys.stdout
        self.started_at = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.running = 0
        self.measured = 0  # cells that ran (not planned skips), for the ETA

    def started(self) -> None:
        self.running += 1

    def finished(self, result: CellResult, ran: bool = True) -> None:
        self.counts[result.status] += 1
        if ran:
            self.running = max(0, self.running - 1)
            self.measured += 1
        detail = f"tpot {result.metrics['tpot_ms']:.2f} ms" if "tpot_ms" in result.metrics else result.error
        cell = result.cell
        label = (
            f"{cell['cache']}{'+compile' if cell['compile'] else ''} ctx={cell['context_length']} "
            f"bs={cell['batch_size']} {cell['dtype']} {cell['model']}"
        )
        print(f"{self.line()} | {result.status}: {label} {detail[:120]}", file=self.stream, flush=True)

    def resumed(self, result: CellResult, counts_as_run: bool) -> None:
        """A result an earlier invocation already logged: counted, not printed, not in the ETA."""
        self.counts[result.status] += 1
        if counts_as_run:
            self.to_run -= 1

    def line(self) -> str:
        done = sum(self.counts.values())
        elapsed = time.monotonic() - self.started_at
        left = self.total - done - self.running
        by_status = " ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])
        remaining_runs = self.to_run - self.measured
        eta = "?" if self.measured == 0 else _clock(elapsed / self.measured * remaining_runs)
        return (
            f"[{done}/{self.total}] {by_status} | running {self.running} | left {left} | "
            f"{_clock(elapsed)} elapsed | ETA {eta}"
        )

    def counts_by_status(self) -> dict[str, int]:
        return {s: self.counts[s] for s in STATUSES}
