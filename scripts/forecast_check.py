"""Does the forecast still match what cells took? The gate CI runs on stored results, with no sweep to run.

`scripts/benchmarks/forecast_check_set.json` keeps cells of real sweeps the forecast was never fitted on
(written by `scripts/benchmarks/forecast_accuracy.py`): bfloat16 cells (this CPU has no bfloat16 instructions), a
model shape outside the calibration (TinyLlama-1.1B's), other contexts, caches and a workload. Each keeps what the
cell took (`cell_wall_s`, its TTFT and TPOT medians), its model's cost as the planner read it, its protocol, and the
probe readings its sweep took as it started (`forecast.json`). This script forecasts every cell again with the code
as it is now, from those readings, and fails (exit 1) when the median |log(took ÷ forecast)| of the check cells'
wall times exceeds `BOUND`, or their TTFT's or TPOT's exceeds `TERM_BOUND`: a change to the forecast that makes it
worse on cells it never saw does not land. The calibration cells are shown, not gated (they were fitted).

    python scripts/forecast_check.py [--set FILE]
"""

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kvsweep.forecast.cell_forecast import ModelCost, forecast_cell
from kvsweep.forecast.device_rates import CpuProbes, cpu_rates
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.shape import KvShape

STORED = Path(__file__).resolve().parent / "benchmarks" / "forecast_check_set.json"
BOUND = math.log(1.3)  # median |log ratio| of the check cells' wall times (1.11x when the set was stored)
TERM_BOUND = math.log(1.6)  # of their prefills (TTFT: 1.31x) and decode steps (TPOT: 1.14x)
CALIBRATION = "calibration"


@dataclass(frozen=True)
class Checked:
    set: str
    label: str
    wall: float  # took ÷ forecast
    ttft: float | None
    tpot: float | None


def model_of(data: dict[str, Any]) -> ModelCost:
    shape = data["shape"]
    tuples = {f.name for f in fields(KvShape) if f.name in shape and isinstance(shape[f.name], list)}
    kv = KvShape(**{k: tuple(v) if k in tuples else v for k, v in shape.items()})
    return ModelCost(**{**data, "shape": kv})


def check(record: dict[str, Any]) -> Checked:
    """One stored cell forecast again from its sweep's probe readings, set against what it took."""
    cell = Cell(**record["cell"])
    protocol = MeasureProtocol.from_dict(record["protocol"])
    rates = cpu_rates(CpuProbes(record["probes"]["flop_rates"], record["probes"]["bandwidth"]))
    forecast = forecast_cell(cell, protocol, model_of(record["model"]), rates)
    took = record["took"]

    def ratio(measured: float | None, predicted: float) -> float | None:
        return None if measured is None or predicted <= 0 else measured / predicted

    return Checked(
        record["set"],
        record["label"],
        took["wall_s"] / forecast.seconds,
        ratio(took.get("ttft_s"), forecast.ttft_s),
        ratio(took.get("tpot_s"), forecast.tpot_s),
    )


def median_log(values: list[float | None]) -> float | None:
    logs = [abs(math.log(v)) for v in values if v is not None]
    return statistics.median(logs) if logs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", type=Path, default=STORED, help="the stored cells (default: %(default)s)")
    args = parser.parse_args(argv)
    stored = json.loads(args.set.read_text())
    checked = [check(record) for record in stored["cells"]]
    print(f"forecast check on {args.set.name}: {stored['measured']}")
    print("| set | cell | took ÷ forecast | TTFT | TPOT |\n| --- | --- | --- | --- | --- |")
    for c in checked:
        ttft, tpot = (f"{v:.2f}" if v is not None else "-" for v in (c.ttft, c.tpot))
        print(f"| {c.set} | {c.label} | {c.wall:.2f} | {ttft} | {tpot} |")
    gated = [c for c in checked if c.set != CALIBRATION]
    failed = []
    for name, values, bound in (
        ("wall time", [c.wall for c in gated], BOUND),
        ("TTFT", [c.ttft for c in gated], TERM_BOUND),
        ("TPOT", [c.tpot for c in gated], TERM_BOUND),
    ):
        found = median_log(values)
        if found is None:
            continue
        ok = found <= bound
        print(
            f"{name}: median |log(took ÷ forecast)| {found:.3f} ({math.exp(found):.2f}x) over "
            f"{sum(v is not None for v in values)} check cells; bound {bound:.3f} ({math.exp(bound):.2f}x): "
            f"{'met' if ok else 'MISSED'}"
        )
        if not ok:
            failed.append(name)
    if failed:
        print(f"the forecast drifted from what the check cells took ({', '.join(failed)})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
