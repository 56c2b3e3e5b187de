"""A sweep's bill before it runs: every cell's forecast, the GPU-hours, the wall time on the cluster, the cost.

GPU-hours *busy* are each cell's seconds times the GPUs it holds, plus the Hub downloads the whole cluster waits for
before the first cell (each model once, at `HUB_BYTES_PER_S`). The wall time packs the cells onto the cluster's
slots (GPUs ÷ GPUs a cell, at most `ray.max_concurrent`) in the order the sweep runs them (`grid.run_order`: the
fewest tokens first), each on the first free slot, as the scheduler does; on a CPU one cell runs at a time.
GPU-hours *held* are every GPU of the cluster for that wall time: what a reserved cluster costs, since its GPUs are
held until the last cell ends. The cost and a budget (`planner.max_gpu_hours`, checked before any cell starts)
count the held hours; a budget over cells with no forecast is refused, saying which.
"""

import heapq
import json
from dataclasses import dataclass, field

from kvsweep.errors import ConfigError
from kvsweep.forecast.cell_forecast import CellForecast
from kvsweep.forecast.device_rates import DeviceRates
from kvsweep.forecast.terms import duration
from kvsweep.grid import Cell, run_order

HUB_BYTES_PER_S = 200e6  # a model's files from the Hub to a node: a typical datacentre download, a guess
LARGEST_SHOWN = 3
FORECAST_JSON_VERSION = 1  # bumped when a key changes meaning; new keys may appear without a bump


@dataclass(frozen=True)
class ForecastCell:
    cell_id: str
    cell: Cell
    forecast: CellForecast


@dataclass
class SweepBill:
    cells: list[ForecastCell]
    rates: DeviceRates | None  # None: no rates to forecast with (`unavailable` says why)
    gpus: int  # the cluster's GPUs the bill counts (0 on a CPU)
    gpus_per_cell: int
    slots: int  # cells running at once
    gpu_hour_cost: float = 0.0
    download_bytes: int = 0  # Hub models to fetch before the first cell
    unforecast: list[str] = field(default_factory=list)  # cells with no forecast: why
    unavailable: str = ""  # why there is no forecast at all (a GPU sweep planned where no GPU is named)

    @property
    def cell_seconds(self) -> float:
        return sum(c.forecast.seconds for c in self.cells)

    @property
    def download_s(self) -> float:
        return self.download_bytes / HUB_BYTES_PER_S

    @property
    def gpu_hours(self) -> float:
        """The cells' GPU time and the downloads the cluster's GPUs wait through (0 on a CPU)."""
        if not self.gpus:
            return 0.0
        return (self.cell_seconds * self.gpus_per_cell + self.download_s * self.gpus) / 3600

    @property
    def held_gpu_hours(self) -> float:
        """Every GPU of the cluster for the whole wall time (0 on a CPU): what reserving it costs."""
        return self.gpus * self.wall_s / 3600

    @property
    def budget_hours(self) -> float:
        """What `planner.max_gpu_hours` and the cost are held against: the GPU-hours held, or on a CPU the sweep's
        own hours."""
        return self.held_gpu_hours if self.gpus else self.wall_s / 3600

    @property
    def wall_s(self) -> float:
        ordered = sorted(self.cells, key=lambda c: run_order(c.cell))  # stable: plan order within one size
        return self.download_s + packed_seconds([c.forecast.seconds for c in ordered], self.slots)

    def largest(self, count: int = LARGEST_SHOWN) -> list[ForecastCell]:
        return sorted(self.cells, key=lambda c: -c.forecast.seconds)[:count]

    def lines(self) -> list[str]:
        """The dry run's bill: the totals, what the figures rest on, and the largest cells with their terms."""
        if self.rates is None:
            return [f"forecast: none ({self.unavailable})"]
        on = f"{self.gpus} GPUs ({self.slots} cells at a time)" if self.gpus else "this CPU (one cell at a time)"
        hours = f"{self.gpu_hours:.2f} GPU-hours busy, {self.held_gpu_hours:.2f} held, " if self.gpus else ""
        cost = (
            f", {self.held_gpu_hours * self.gpu_hour_cost:,.2f} at {self.gpu_hour_cost:g} a GPU-hour held"
            if (self.gpus and self.gpu_hour_cost)
            else ""
        )
        lines = [
            f"forecast: {len(self.cells)} cells, {hours}{duration(self.wall_s)} on {on}{cost}",
            f"  rates: {self.rates.label()}",
        ]
        if self.download_bytes:
            lines.append(f"  Hub downloads: {self.download_bytes / 1e9:.1f} GB, {duration(self.download_s)}")
        for c in self.largest():
            lines.append(f"  largest: {c.cell.label} {duration(c.forecast.seconds)}")
            lines += [f"    {line}" for line in c.forecast.forecast.describe().splitlines()]
        lines += [f"  no forecast: {why}" for why in self.unforecast]
        return lines

    def to_json(self) -> str:
        """`forecast.json`: the totals, the rates and what they were computed from (a CPU's probe readings), and
        each cell's seconds by term, for scripts and for checking the forecast again on what the cells took."""
        rates = self.rates
        return json.dumps(
            {
                "version": FORECAST_JSON_VERSION,
                "rates": None if rates is None else rates.to_dict(),
                "unavailable": self.unavailable,
                "gpus": self.gpus,
                "slots": self.slots,
                "wall_s": self.wall_s if rates else None,
                "gpu_hours_busy": self.gpu_hours,
                "gpu_hours_held": self.held_gpu_hours,
                "cells": [
                    {
                        "cell_id": c.cell_id,
                        "label": c.cell.label,
                        "seconds": c.forecast.seconds,
                        "ttft_s": c.forecast.ttft_s,
                        "tpot_s": c.forecast.tpot_s,
                        "terms": {t.name: t.seconds for t in c.forecast.forecast.terms},
                    }
                    for c in self.cells
                ],
                "unforecast": self.unforecast,
            },
            indent=1,
        )

    def check_budget(self, max_gpu_hours: float) -> None:
        """A one-line `ConfigError` when the forecast is over `planner.max_gpu_hours` (0: no budget)."""
        if max_gpu_hours > 0 and self.rates is None:
            raise ConfigError(f"planner.max_gpu_hours={max_gpu_hours:g} needs a forecast: {self.unavailable}")
        if max_gpu_hours > 0 and self.unforecast:
            more = f" and {len(self.unforecast) - 1} more" if len(self.unforecast) > 1 else ""
            raise ConfigError(
                f"planner.max_gpu_hours={max_gpu_hours:g} cannot hold {len(self.unforecast)} cells with no forecast "
                f"({self.unforecast[0]}{more}); drop the budget or those cells"
            )
        if max_gpu_hours > 0 and self.budget_hours > max_gpu_hours:
            top = self.largest(1)
            biggest = f"; the largest cell is {top[0].cell.label} ({duration(top[0].forecast.seconds)})" if top else ""
            unit = "GPU-hours held" if self.gpus else "hours"
            raise ConfigError(
                f"planner.max_gpu_hours={max_gpu_hours:g}: the sweep is forecast to take {self.budget_hours:.2f} "
                f"{unit} on {self.rates.name if self.rates else '?'}{biggest}; raise the budget or shrink the grid"
            )


def packed_seconds(seconds: list[float], slots: int) -> float:
    """When the last of `seconds` ends on `slots` slots, each in the order given on the first free slot."""
    ends = [0.0] * max(1, slots)
    for s in seconds:
        heapq.heapreplace(ends, ends[0] + s)
    return max(ends)


def cell_lines(cells: list[ForecastCell]) -> list[str]:
    """plan.txt's per-cell forecast, indented under the bill so no line reads as a plan line:
    `  <label>  42.1 s  (measured 61%, quality 22%)`, the two largest terms."""
    lines = []
    for c in cells:
        forecast = c.forecast.forecast
        total = forecast.total or 1.0
        top = sorted(forecast.terms, key=lambda t: -t.seconds)[:2]
        parts = ", ".join(f"{t.name} {t.seconds / total:.0%}" for t in top)
        lines.append(f"  {c.cell.label}  {duration(forecast.total)}  ({parts})")
    return lines
