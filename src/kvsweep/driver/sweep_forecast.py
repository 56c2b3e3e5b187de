"""The sweep's forecast as the driver makes it: the device's rates, each planned cell's forecast, the bill.

The rates are this CPU's, measured here, or a GPU's datasheet figures (`planner.gpu`, else the local GPU's name).
The GPU count the bill counts is `planner.gpus`, else the connected cluster's. A capacity search's later probes are
not planned until results come, so each first probe is counted as many times as the searches expect probes.
A resumed sweep refines its remaining cells by what the finished ones took against their forecast (`refined`).
"""

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kvsweep.config.schema import KvSweepConfig
from kvsweep.errors import ConfigError
from kvsweep.forecast.cell_forecast import CellForecast, forecast_cell, model_cost
from kvsweep.forecast.device_rates import DeviceRates, choose_gpu, cpu_rates, gpu_rates, probe_cpu
from kvsweep.forecast.sweep_bill import ForecastCell, SweepBill
from kvsweep.forecast.terms import Forecast, Term
from kvsweep.grid import Cell, MeasureProtocol, cell_id
from kvsweep.model_names import display_names
from kvsweep.models.resolve import classify
from kvsweep.names import Metric
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.plan.sweep_plan import model_facts
from kvsweep.results import OK, CellResult

if TYPE_CHECKING:
    from kvsweep.driver.capacity_search import CapacitySearches
    from kvsweep.driver.job_sources import JobSource
    from kvsweep.driver.ray_session import RaySession
    from kvsweep.plan.sweep_plan import PlanLimits

REFINE_TERM = "refined"  # the term a resumed sweep adds: finished cells of the model took this much more (or less)


@dataclass(frozen=True)
class SweepForecast:
    bill: SweepBill
    by_id: dict[str, CellForecast]
    make: Callable[[Cell], CellForecast | None] | None = None  # a cell planned later (a search's next probe)

    def add(self, cid: str, cell: Cell) -> float | None:
        """Forecast a cell planned after the sweep started (a capacity search's next probe): its seconds, or None."""
        forecast = self.make(cell) if self.make is not None else None
        if forecast is not None:
            self.by_id[cid] = forecast
        return None if forecast is None else forecast.seconds

    def metrics(self, result: CellResult) -> dict[str, float]:
        """What a finished cell logs: `forecast_s`, `forecast_ratio` (its `cell_wall_s` ÷ it) and the ratio of each
        term it measures (load, TTFT, TPOT, quality), where it ran and has them."""
        forecast = self.by_id.get(result.cell_id)
        if forecast is None or forecast.seconds <= 0:
            return {}
        found = {Metric.FORECAST_S: forecast.seconds}
        if result.status != OK or result.wall_s <= 0:
            return found
        found[Metric.FORECAST_RATIO] = result.wall_s / forecast.seconds  # wall_s: the driver's clock, this run
        m = result.metrics
        pairs = {
            Metric.FORECAST_RATIO_LOAD: (m.get(Metric.MODEL_LOAD_S), forecast.term("load")),
            Metric.FORECAST_RATIO_QUALITY: (m.get(Metric.QUALITY_CHECK_S), forecast.term("quality")),
        }
        if not result.cell.is_workload:
            pairs[Metric.FORECAST_RATIO_TTFT] = (_seconds(m.get(Metric.TTFT_MS)), forecast.ttft_s)
            pairs[Metric.FORECAST_RATIO_TPOT] = (_seconds(m.get(Metric.TPOT_MS)), forecast.tpot_s)
        for name, (measured, predicted) in pairs.items():
            if measured is not None and predicted > 0:
                found[name] = measured / predicted
        return found


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


def device_rates(cfg: KvSweepConfig, device: str, cluster_gpu_names: list[str] | None = None) -> DeviceRates:
    """This CPU's measured rates, or the GPU's datasheet ones: `planner.gpu`, else a local GPU, else one the
    cluster's nodes reported (a one-line ConfigError when none is named or known)."""
    if device != "cuda":
        return cpu_rates(probe_cpu(cfg.measure.threads, cfg.grid.dtypes))
    names = local_gpu_names() or list(cluster_gpu_names or [])
    return gpu_rates(choose_gpu(cfg.planner.gpu, names), cfg.planner.host_link_gbps)


def local_gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def bill_gpus(cfg: KvSweepConfig, device: str, cluster_gpus: float) -> int:
    """The GPUs the bill counts: the connected cluster's, else `planner.gpus` (a dry run elsewhere), else 1."""
    if device != "cuda":
        return 0
    return int(cluster_gpus) if cluster_gpus > 0 else int(cfg.planner.gpus or 1)


def forecast_sweep(
    cfg: KvSweepConfig,
    device: str,
    planned: list[PlannedCell],
    protocol: MeasureProtocol,
    slots: int,
    cluster_gpus: float,
    gpus_per_cell: int,
    probes_per_cell: float = 1.0,
    cluster_gpu_names: list[str] | None = None,
) -> SweepForecast:
    """Every planned cell that runs, forecast. `slots`: cells the scheduler runs at once; `probes_per_cell`: a
    capacity search's expected probes per first probe (each first probe's own forecast is kept for its ratio and
    the ETA; the bill counts its search's probes). A GPU sweep planned where no GPU is named or found gets no
    forecast, saying why (a budget then refuses)."""
    gpus = bill_gpus(cfg, device, cluster_gpus)
    try:
        rates = device_rates(cfg, device, cluster_gpu_names)
    except ConfigError as err:
        return SweepForecast(SweepBill([], None, gpus, gpus_per_cell, slots, unavailable=str(err)), {})
    facts, problems = model_facts(list(dict.fromkeys(cfg.grid.models)), cfg.trust_remote_code, cfg.grid.weights)

    def make(cell: Cell) -> CellForecast | None:
        fact = facts.get(cell.model)
        if fact is None or fact.planned_parameters is None:
            return None
        model = model_cost(cell, fact.planned_parameters, fact.layout, fact.shape, device)
        return forecast_cell(cell, protocol, model, rates)

    cells, unforecast, by_id = [], [], {}
    for p in planned:
        if not p.runs:
            continue
        forecast = None if p.cell.model in problems else make(p.cell)
        if forecast is None:
            why = "the model cannot be read here" if p.cell.model in problems else "its size is not known here"
            unforecast.append(f"{p.cell.label}: {why}")
            continue
        cid = cell_id(p.cell, protocol)
        by_id[cid] = forecast
        billed = forecast if probes_per_cell == 1.0 else _scaled(forecast, probes_per_cell, "probes")
        cells.append(ForecastCell(cid, p.cell, billed))
    bill = SweepBill(
        cells,
        rates,
        gpus,
        gpus_per_cell if device == "cuda" else 0,
        slots,
        cfg.report.gpu_hour_cost,
        download_bytes=_download_bytes(cfg, facts),
        unforecast=unforecast,
    )
    return SweepForecast(bill, by_id, make)


def _download_bytes(cfg: KvSweepConfig, facts: dict) -> int:
    """A Hub model's weights in their stored 16-bit form, once each: what the nodes fetch before the first cell."""
    total = 0
    for model in dict.fromkeys(cfg.grid.models):
        fact = facts.get(model)
        if classify(model).kind == "hub" and fact is not None and fact.parameters:
            total += 2 * fact.parameters
    return total


def _scaled(forecast: CellForecast, factor: float, why: str, keep: tuple[str, ...] = ()) -> CellForecast:
    """Every term times `factor` (but those named in `keep`), and a note saying why."""
    terms = tuple(t if t.name in keep else replace(t, seconds=t.seconds * factor) for t in forecast.forecast.terms)
    note = Term(why, 0.0, f"each term × {factor:.2g}")
    return replace(forecast, forecast=Forecast((*terms, note)))


def refined(forecast: SweepForecast, finished: list[CellResult]) -> tuple[SweepForecast, str]:
    """The forecast of the cells still to run (a resumed sweep's), each model's scaled by the median
    `cell_wall_s` ÷ forecast of its finished cells on this device, and a compiled cell's compile allowance
    replaced by what a finished compiled cell of the model measured; a line saying so ("": nothing refined)."""
    ratios: dict[str, list[float]] = {}
    compiles: dict[str, list[float]] = {}
    done = {result.cell_id for result in finished}
    for result in finished:
        predicted = forecast.by_id.get(result.cell_id)
        if predicted is not None and result.status == OK and result.wall_s > 0 and predicted.seconds > 0:
            ratios.setdefault(result.cell.model, []).append(result.wall_s / predicted.seconds)
        if (seconds := measured_compile(result)) is not None:
            compiles.setdefault(result.cell.model, []).append(seconds)
    factor = {model: statistics.median(values) for model, values in ratios.items()}
    compile_s = {model: statistics.median(values) for model, values in compiles.items()}
    by_id = dict(forecast.by_id)
    cells = []
    for c in forecast.bill.cells:
        if c.cell_id in done:
            continue
        changed = c.forecast
        if c.cell.compile and not c.cell.is_workload and (seconds := compile_s.get(c.cell.model)) is not None:
            terms = tuple(
                replace(t, seconds=seconds, detail="measured") if t.name == "compile" else t
                for t in changed.forecast.terms
            )
            changed = replace(changed, forecast=Forecast(terms))
        if (f := factor.get(c.cell.model)) is not None:
            changed = _scaled(changed, f, REFINE_TERM)
        by_id[c.cell_id] = changed
        cells.append(ForecastCell(c.cell_id, c.cell, changed))
    said = [f"{len(ratios[m])} finished cells took {f:.2g}x" for m, f in factor.items()]
    said += [f"compile measured {s:.0f} s ({display_names(compile_s)[m]})" for m, s in compile_s.items()]
    line = f"forecast refined for the remaining cells: {', '.join(said)}" if said else ""
    return SweepForecast(replace(forecast.bill, cells=cells), by_id, forecast.make), line


def measured_compile(result: CellResult) -> float | None:
    """What compiling took a finished compiled fixed-shape cell: its cold call beyond a measured call (the
    prefill and the decode steps its medians give); None for any other cell."""
    m, cell = result.metrics, result.cell
    if not cell.compile or cell.is_workload or result.status != OK:
        return None
    if not all(k in m for k in (Metric.FIRST_CALL_MS, Metric.TTFT_MS, Metric.TPOT_MS)):
        return None
    call_ms = m[Metric.TTFT_MS] + (cell.max_new_tokens - 1) * m[Metric.TPOT_MS]
    return max(0.0, (m[Metric.FIRST_CALL_MS] - call_ms) / 1e3)


def forecast_jobs(
    cfg: KvSweepConfig,
    device: str,
    session: "RaySession",
    source: "JobSource",
    limits: "PlanLimits",
    gpu_names: list[str] | None = None,
) -> SweepForecast:
    """The forecast of the source's planned cells on the cluster (a search's first probes, times its probes);
    `gpu_names`: the GPU models its nodes reported."""
    from kvsweep.driver.job_sources import SearchJobs

    probes = 1.0
    if isinstance(source, SearchJobs) and source.searches is not None:
        probes = search_probes(source.searches, len(source.cells))
    slots = scheduler_slots(cfg, device, session.gpus, limits.gpus, session.node_gpus)
    return forecast_sweep(
        cfg, device, source.cells, source.protocol, slots, session.gpus, limits.gpus, probes, gpu_names
    )


def scheduler_slots(
    cfg: KvSweepConfig, device: str, cluster_gpus: float, gpus_per_cell: int, node_gpus: tuple[float, ...] = ()
) -> int:
    """Cells at a time, as the scheduler will run them on the GPUs the bill counts, and never more than fit on the
    connected cluster's nodes (a `ray.max_concurrent` above that waits for GPUs: the bill does not count on it)."""
    from kvsweep.driver.scheduler import cells_that_fit, max_concurrent

    gpus = bill_gpus(cfg, device, cluster_gpus)
    slots = max_concurrent(cfg.ray.max_concurrent, device, gpus, gpus_per_cell, node_gpus)
    return min(slots, cells_that_fit(gpus, gpus_per_cell, node_gpus)) if device == "cuda" else slots


def search_probes(searches: "CapacitySearches", first_probes: int) -> float:
    """Probes the searches are expected to take per first probe: two per predicted frontier (one when it starts
    at its top), and a search without a prediction doubles its way from its start to its top."""
    total = 0
    for search in searches.searches:
        start = search.stepping.start * search.step
        if search.predicted is not None:
            total += 1 if start >= search.top else 2
        else:
            total += math.ceil(math.log2(max(search.top / max(start, 1), 1))) + 1
    return total / max(1, first_probes)


RATIO_WORDS = {
    Metric.FORECAST_RATIO_LOAD: "model loads",
    Metric.FORECAST_RATIO_TTFT: "prefills (TTFT)",
    Metric.FORECAST_RATIO_TPOT: "decode steps (TPOT)",
    Metric.FORECAST_RATIO_QUALITY: "quality checks",
}


def forecast_summary(results: list[CellResult]) -> str:
    """The run's end: 'forecast: cells took 1.3x their forecast (median of 12); model loads 0.8x, ...'; '' when
    no cell has a forecast ratio."""
    walls = [r.metrics[Metric.FORECAST_RATIO] for r in results if Metric.FORECAST_RATIO in r.metrics]
    if not walls:
        return ""
    total_wall = sum(r.wall_s for r in results if Metric.FORECAST_RATIO in r.metrics)
    total_forecast = sum(r.metrics[Metric.FORECAST_S] for r in results if Metric.FORECAST_RATIO in r.metrics)
    parts = []
    for metric, words in RATIO_WORDS.items():
        values = [r.metrics[metric] for r in results if metric in r.metrics]
        if values:
            parts.append(f"{words} {statistics.median(values):.2g}x")
    return (
        f"forecast: cells took {statistics.median(walls):.2g}x their forecast (median of {len(walls)}; "
        f"{total_wall / total_forecast:.2g}x in total)" + (f"; {', '.join(parts)}" if parts else "")
    )
