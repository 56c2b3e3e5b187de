"""How close is the forecast to what cells take on this CPU? Calibrate on one set of cells, check on another.

Runs real sweeps (`python -m kvsweep`, Ray, MLflow) of two disjoint sets of cells: the calibration set fits the
CPU's shares and fixed costs (the FLOP share from TTFT, the bandwidth share and per-layer overhead from TPOT, a
quantized cache's extra step overhead, the load rate, a cell's start); the check set, never used to fit, is
forecast with the fitted figures and set against what its cells took (`cell_wall_s`). The targets: every checked
cell within 2x, the set's total within 1.5x. Paste the fitted figures into `kvsweep/forecast/device_rates.py`
(`CPU_*`) and `cell_forecast.STEP_OVERHEAD_FACTOR` after a run on a quiet machine.

    python scripts/benchmarks/forecast_accuracy.py [--reuse DIR]
"""

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvsweep.config.compose import compose_config
from kvsweep.driver.inputs_choice import choose_inputs
from kvsweep.forecast import cell_forecast
from kvsweep.forecast.cell_forecast import ModelCost, call_cost, forecast_cell
from kvsweep.forecast.device_rates import DeviceRates, cpu_rates, probe_flop_rate
from kvsweep.measure.bandwidth import device_bandwidth
from kvsweep.names import Metric
from kvsweep.plan.memory_fit import weights_bytes
from kvsweep.plan.sweep_plan import model_facts, protocol_of, sweep_workload
from kvsweep.results import OK, CellResult
from kvsweep.tracking.journal import Journal
from kvsweep.units import GB
from kvsweep_testkit.real_model import ensure_real_model

REAL = "{real}"  # the real pretrained model's folder, filled in at run time
COMMON = ("device=cpu", "measure=brief")
SWEEPS = {
    # Calibration: the tiny preset (random ids) and the real model (its passkey task), dense, static, quantized.
    "calibration": (
        f"grid.models=[tiny-llama,{REAL}]",
        "grid.dtypes=[float32]",
        "grid.context_lengths=[256,1024]",
        "grid.caches=[dynamic,static,quantized-quanto-int4]",
    ),
    # Check: other dtypes, contexts, caches and models, and a workload; nothing here is fitted.
    "check": (
        f"grid.models=[tiny-llama,smollm2-135m,{REAL}]",
        "grid.dtypes=[float32]",
        "grid.context_lengths=[512,2048]",
        "grid.caches=[dynamic,quantized-hqq-int4,quantized-fp8]",
    ),
    "check-workload": (
        "grid.models=[tiny-llama]",
        "grid.dtypes=[float32]",
        "grid.batch_sizes=[2]",
        "grid.caches=[dynamic,static,paged]",
        "workload.source=lengths",
        'workload.input_lengths="fixed:64,256"',
        'workload.output_lengths="fixed:8,24"',
        "workload.requests=12",
        "workload.serving=[sequential,batched]",
    ),
}
CELL_BOUND, TOTAL_BOUND = 2.0, 1.5


@dataclass(frozen=True)
class Sample:
    result: CellResult
    model: ModelCost
    overrides: tuple[str, ...]


def run_sweeps(folder: Path, real: str) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {}
    for name, overrides in SWEEPS.items():
        given = tuple(o.replace(REAL, real) for o in (*COMMON, *overrides))
        run_dir = folder / name
        if not (run_dir / "journal.jsonl").exists():
            store = f"sqlite:///{folder / (name + '.db')}"
            command = [
                sys.executable,
                "-m",
                "kvsweep",
                *given,
                f"mlflow.tracking_uri={store}",
                f"hydra.run.dir={run_dir}",
            ]
            print(f"running the {name} sweep ...", flush=True)
            subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
        samples[name] = read_samples(run_dir, given)
    return samples


def read_samples(run_dir: Path, overrides: tuple[str, ...]) -> list[Sample]:
    cfg = compose_config(list(overrides)).config
    facts, _ = model_facts(list(cfg.grid.models), cfg.trust_remote_code, cfg.grid.weights)
    found = []
    for result in Journal(run_dir).read().results:
        if result.status != OK or result.wall_s <= 0:
            continue
        fact = facts[result.cell.model]
        params = fact.planned_parameters or 0
        found.append(
            Sample(result, ModelCost(params, weights_bytes(result.cell, params, fact.layout), fact.shape), overrides)
        )
    return found


def protocol_for(sample: Sample):
    cfg = compose_config(list(sample.overrides)).config
    return protocol_of(cfg.measure, "cpu", choose_inputs(cfg).spec, 1, sweep_workload(cfg))


def unit_rates(flops: float, bandwidth: float) -> DeviceRates:
    """The probes' own rates, no overhead: each call's raw FLOP and byte seconds, to fit against."""
    return DeviceRates("probe", flops, bandwidth, bandwidth, 1.0, 0.0, 0.0, 0.0, True)


def fit(samples: list[Sample], flops: float, bandwidth: float) -> dict[str, float]:
    """The shares and fixed costs that make the calibration cells' TTFT, TPOT, load and wall time agree."""
    unit = unit_rates(flops, bandwidth)
    rows = []  # (step bytes seconds at the probe, layers, tpot s, family) for fixed-shape cells
    for s in samples:
        c = s.result.cell
        if c.is_workload or Metric.TPOT_MS not in s.result.metrics:
            continue
        cost = call_cost(
            cell_forecast.get_strategy(c.cache), c, s.model, unit, c.context_length, c.max_new_tokens, c.batch_size
        )
        family = cell_forecast.get_strategy(c.cache).family
        rows.append(
            (
                cost.prefill_s,
                cost.step_s,
                s.model.shape.layers,
                s.result.metrics[Metric.TTFT_MS] / 1e3,
                s.result.metrics[Metric.TPOT_MS] / 1e3,
                family,
            )
        )
    plain = [r for r in rows if r[5] in ("dense", "static")]
    # TPOT = step_raw / f_bw + layers * o: least squares in (1/f_bw, o) over dense and static cells
    sxx = sum(r[1] ** 2 for r in plain)
    sxl = sum(r[1] * r[2] for r in plain)
    sll = sum(r[2] ** 2 for r in plain)
    sxy = sum(r[1] * r[4] for r in plain)
    sly = sum(r[2] * r[4] for r in plain)
    det = sxx * sll - sxl**2
    inv_bw = (sxy * sll - sly * sxl) / det
    overhead = (sxx * sly - sxl * sxy) / det
    quantized = [(r[4] - r[1] * inv_bw) / (r[2] * overhead) for r in rows if r[5] == "quantized"]
    # TTFT - layers * o = prefill_raw / f_flop: least squares through the origin, so the long prefills (where the
    # FLOPs are the time) decide the share, not the short ones the overhead and noise dominate
    f_flop = sum(r[0] ** 2 for r in rows) / sum(r[0] * (r[3] - r[2] * overhead) for r in rows)
    loads = [
        s.model.weight_bytes / s.result.metrics[Metric.MODEL_LOAD_S]
        for s in samples
        if s.result.metrics.get(Metric.MODEL_LOAD_S)
    ]
    figures = {
        "CPU_BANDWIDTH_FRACTION": 1 / inv_bw,
        "CPU_LAYER_OVERHEAD_S": overhead,
        "quantized step overhead factor": statistics.median(quantized) if quantized else 1.0,
        "CPU_FLOP_FRACTION": f_flop,
        "CPU_LOAD_BYTES_PER_S": statistics.median(loads),
    }
    rates = fitted_rates(figures, flops, bandwidth, start_s=0.0)
    starts = [s.result.wall_s - forecast(s, rates) for s in samples]
    figures["CPU_START_S"] = max(0.0, statistics.median(starts))
    return figures


def fitted_rates(
    figures: dict[str, float], flops: float, bandwidth: float, start_s: float | None = None
) -> DeviceRates:
    base = cpu_rates()
    cell_forecast.STEP_OVERHEAD_FACTOR["quantized"] = figures["quantized step overhead factor"]
    return replace(
        base,
        flop_rate=flops * figures["CPU_FLOP_FRACTION"],
        bandwidth=bandwidth * figures["CPU_BANDWIDTH_FRACTION"],
        host_link=bandwidth * figures["CPU_BANDWIDTH_FRACTION"],
        load_rate=figures["CPU_LOAD_BYTES_PER_S"],
        layer_overhead_s=figures["CPU_LAYER_OVERHEAD_S"],
        start_s=figures.get("CPU_START_S", 0.0) if start_s is None else start_s,
    )


def forecast(sample: Sample, rates: DeviceRates) -> float:
    return forecast_cell(sample.result.cell, protocol_for(sample), sample.model, rates).seconds


def report(name: str, samples: list[Sample], rates: DeviceRates) -> tuple[list[str], float, float]:
    lines = [f"| {name} cell | took s | forecast s | ratio |", "| --- | --- | --- | --- |"]
    worst, took, predicted = 1.0, 0.0, 0.0
    for s in samples:
        f = forecast(s, rates)
        ratio = s.result.wall_s / f
        worst = max(worst, ratio, 1 / ratio)
        took, predicted = took + s.result.wall_s, predicted + f
        lines.append(f"| {s.result.cell.label} | {s.result.wall_s:.1f} | {f:.1f} | {ratio:.2f} |")
    lines.append(f"| **total ({len(samples)} cells)** | {took:.0f} | {predicted:.0f} | {took / predicted:.2f} |")
    return lines, worst, took / predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reuse", type=Path, help="a folder of an earlier run: its sweeps are not run again")
    args = parser.parse_args()
    folder = args.reuse or Path(tempfile.mkdtemp(prefix="kvsweep-forecast-"))
    folder.mkdir(parents=True, exist_ok=True)
    real = str(ensure_real_model())
    samples = run_sweeps(folder, real)
    flops, bandwidth = probe_flop_rate(), device_bandwidth("cpu").gbps * GB
    print(f"probes: {flops / 1e9:.1f} GFLOP/s, {bandwidth / GB:.2f} GB/s; sweeps in {folder}")
    figures = fit(samples["calibration"], flops, bandwidth)
    print("\nfitted on the calibration set:")
    for key, value in figures.items():
        print(f"  {key} = {value:.3g}")
    rates = fitted_rates(figures, flops, bandwidth)
    for name in SWEEPS:
        lines, worst, total = report(name, samples[name], rates)
        print("\n" + "\n".join(lines))
        if name != "calibration":
            cell_ok, total_ok = worst <= CELL_BOUND, max(total, 1 / total) <= TOTAL_BOUND
            print(
                f"worst cell {worst:.2f}x ({'met' if cell_ok else 'MISSED'} {CELL_BOUND}x); total "
                f"{total:.2f} ({'met' if total_ok else 'MISSED'} {TOTAL_BOUND}x)"
            )
    assert not math.isnan(bandwidth)


if __name__ == "__main__":
    main()
