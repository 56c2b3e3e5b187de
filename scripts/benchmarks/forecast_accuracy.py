"""How close is the forecast to what cells take on this CPU? Calibrate on one set of cells, check on another.

Runs real sweeps (`python -m kvsweep`, Ray, MLflow) of two disjoint sets of cells: the calibration set fits the
CPU's shares and fixed costs (the FLOP share from TTFT, the bandwidth share and per-layer overhead from TPOT, a
quantized cache's extra step overhead, the load rate, a cell's start); the check set, never used to fit, is
forecast with the fitted figures and set against what its cells took (`cell_wall_s`): other contexts and caches,
bfloat16 (which this CPU runs without bfloat16 instructions), a model shape the fit never saw (TinyLlama-1.1B's)
and a workload. Every forecast uses the probe readings each sweep took as it started (its `forecast.json`), as the
sweep's own forecast did. The targets: every checked cell within 2x, the set's total within 1.5x. Paste the fitted
figures into `kvsweep/forecast/device_rates.py` (`CPU_*`) and `cell_forecast.STEP_OVERHEAD_FACTOR` after a run on
a quiet machine; `--write-check-set` then stores every cell for `scripts/forecast_check.py`, the gate CI runs.

    python scripts/benchmarks/forecast_accuracy.py [--reuse DIR] [--write-check-set]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvsweep.config.compose import compose_config
from kvsweep.driver.inputs_choice import choose_inputs
from kvsweep.forecast import cell_forecast
from kvsweep.forecast.cell_forecast import ModelCost, call_cost, forecast_cell, model_cost
from kvsweep.forecast.device_rates import CpuProbes, DeviceRates, cpu_rates
from kvsweep.names import FORECAST_JSON, Metric
from kvsweep.plan.sweep_plan import model_facts, protocol_of, sweep_workload
from kvsweep.results import OK, CellResult
from kvsweep.tracking.journal import Journal
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
    # bfloat16: this CPU has no bfloat16 instructions, so its matmuls run several times slower than float32's
    "check-bf16": (
        "grid.models=[tiny-llama,smollm2-135m]",
        "grid.dtypes=[bfloat16]",
        "grid.context_lengths=[256,1024]",
        "grid.caches=[dynamic,static]",
    ),
    # a shape outside the fit: TinyLlama-1.1B (22 layers, hidden 2048, 4.4 GB in float32), short prompts
    "check-shape": (
        "grid.models=[tinyllama-1.1b]",
        "grid.dtypes=[float32,bfloat16]",
        "grid.context_lengths=[128]",
        "grid.max_new_tokens=[8]",
        "grid.caches=[dynamic,quantized-quanto-int4]",
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
CHECK_SET = Path(__file__).resolve().parent / "forecast_check_set.json"


@dataclass(frozen=True)
class Sample:
    result: CellResult
    model: ModelCost
    overrides: tuple[str, ...]
    probes: CpuProbes  # what its sweep's probes read as it started


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


def sweep_probes(run_dir: Path) -> CpuProbes:
    """The probe readings a sweep took as it started, from its `forecast.json`."""
    probes = json.loads((run_dir / FORECAST_JSON).read_text())["rates"]["probes"]
    return CpuProbes(probes["flop_rates"], probes["bandwidth"])


def read_samples(run_dir: Path, overrides: tuple[str, ...]) -> list[Sample]:
    cfg = compose_config(list(overrides)).config
    facts, _ = model_facts(list(cfg.grid.models), cfg.trust_remote_code, cfg.grid.weights)
    probes = sweep_probes(run_dir)
    found = []
    for result in Journal(run_dir).read().latest_results():
        if result.status != OK or result.wall_s <= 0:
            continue
        fact = facts[result.cell.model]
        model = model_cost(result.cell, fact.planned_parameters or 0, fact.layout, fact.shape, "cpu")
        found.append(Sample(result, model, overrides, probes))
    return found


def protocol_for(sample: Sample):
    cfg = compose_config(list(sample.overrides)).config
    return protocol_of(cfg.measure, "cpu", choose_inputs(cfg).spec, 1, sweep_workload(cfg))


def unit_rates(probes: CpuProbes) -> DeviceRates:
    """The probes' own rates, no overhead: each call's raw FLOP and byte seconds, to fit against."""
    flops, bandwidth = probes.flop_rates["float32"], probes.bandwidth
    return DeviceRates("probe", flops, bandwidth, bandwidth, 1.0, 0.0, 0.0, 0.0, True, None, probes.flop_rates)


def fit(samples: list[Sample]) -> dict[str, float]:
    """The shares and fixed costs that make the calibration cells' TTFT, TPOT, load and wall time agree."""
    rows = []  # (step bytes seconds at the probe, layers, tpot s, family) for fixed-shape cells
    for s in samples:
        c = s.result.cell
        if c.is_workload or Metric.TPOT_MS not in s.result.metrics:
            continue
        unit = unit_rates(s.probes)
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
    starts = [s.result.wall_s - forecast(s, fitted_rates(figures, s.probes, start_s=0.0)) for s in samples]
    figures["CPU_START_S"] = max(0.0, statistics.median(starts))
    return figures


def fitted_rates(figures: dict[str, float], probes: CpuProbes, start_s: float | None = None) -> DeviceRates:
    """A sweep's CPU rates from its probes at the fitted figures (`cpu_rates` at the constants pasted in)."""
    base = cpu_rates(probes)
    cell_forecast.STEP_OVERHEAD_FACTOR["quantized"] = figures["quantized step overhead factor"]
    share = figures["CPU_FLOP_FRACTION"]
    bandwidth = probes.bandwidth * figures["CPU_BANDWIDTH_FRACTION"]
    return replace(
        base,
        flop_rate=probes.flop_rates["float32"] * share,
        dtype_flop_rates={d: r * share for d, r in probes.flop_rates.items()},
        bandwidth=bandwidth,
        host_link=bandwidth,
        load_rate=figures["CPU_LOAD_BYTES_PER_S"],
        layer_overhead_s=figures["CPU_LAYER_OVERHEAD_S"],
        start_s=figures.get("CPU_START_S", 0.0) if start_s is None else start_s,
    )


def forecast(sample: Sample, rates: DeviceRates) -> float:
    return forecast_cell(sample.result.cell, protocol_for(sample), sample.model, rates).seconds


def report(name: str, samples: list[Sample], figures: dict[str, float]) -> tuple[list[str], float, float]:
    lines = [f"| {name} cell | took s | forecast s | ratio |", "| --- | --- | --- | --- |"]
    worst, took, predicted = 1.0, 0.0, 0.0
    for s in samples:
        f = forecast(s, fitted_rates(figures, s.probes))
        ratio = s.result.wall_s / f
        worst = max(worst, ratio, 1 / ratio)
        took, predicted = took + s.result.wall_s, predicted + f
        lines.append(f"| {s.result.cell.label} | {s.result.wall_s:.1f} | {f:.1f} | {ratio:.2f} |")
    lines.append(f"| **total ({len(samples)} cells)** | {took:.0f} | {predicted:.0f} | {took / predicted:.2f} |")
    return lines, worst, took / predicted


def check_record(name: str, sample: Sample) -> dict[str, Any]:
    """One cell as `scripts/forecast_check.py` reads it: what it took, its model's cost, its protocol, and its
    sweep's probe readings (the real model's folder is named by its label only)."""
    m = sample.result.metrics
    took = {"wall_s": sample.result.wall_s}
    if not sample.result.cell.is_workload and Metric.TTFT_MS in m:
        took |= {"ttft_s": m[Metric.TTFT_MS] / 1e3, "tpot_s": m[Metric.TPOT_MS] / 1e3}
    return {
        "set": name,
        "label": sample.result.cell.label,
        "cell": asdict(sample.result.cell),
        "protocol": protocol_for(sample).to_dict(),
        "model": asdict(sample.model),
        "probes": sample.probes.to_dict(),
        "took": took,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reuse", type=Path, help="a folder of an earlier run: its sweeps are not run again")
    parser.add_argument("--write-check-set", action="store_true", help=f"store every cell in {CHECK_SET}")
    args = parser.parse_args()
    folder = args.reuse or Path(tempfile.mkdtemp(prefix="kvsweep-forecast-"))
    folder.mkdir(parents=True, exist_ok=True)
    real = str(ensure_real_model())
    samples = run_sweeps(folder, real)
    print(f"sweeps in {folder}; the calibration sweep's probes: {samples['calibration'][0].probes.to_dict()}")
    figures = fit(samples["calibration"])
    print("\nfitted on the calibration set:")
    for key, value in figures.items():
        print(f"  {key} = {value:.3g}")
    for name in SWEEPS:
        lines, worst, total = report(name, samples[name], figures)
        print("\n" + "\n".join(lines))
        if name != "calibration":
            cell_ok, total_ok = worst <= CELL_BOUND, max(total, 1 / total) <= TOTAL_BOUND
            print(
                f"worst cell {worst:.2f}x ({'met' if cell_ok else 'MISSED'} {CELL_BOUND}x); total "
                f"{total:.2f} ({'met' if total_ok else 'MISSED'} {TOTAL_BOUND}x)"
            )
    if args.write_check_set:
        cells = [check_record(name, s) for name, found in samples.items() for s in found]
        measured = f"{date.today()}, {len(cells)} cells of `scripts/benchmarks/forecast_accuracy.py` on a 2-core CPU"
        CHECK_SET.write_text(json.dumps({"measured": measured, "cells": cells}, indent=1) + "\n")
        print(f"\n{len(cells)} cells stored in {CHECK_SET}")


if __name__ == "__main__":
    main()
