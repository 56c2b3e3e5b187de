"""How repeatable are kvsweep's medians, and how many repeats (and seconds) does a cell need?

The quickstart grid's runnable cells are measured three times, round after round like three sweeps,
with the quickstart protocol: the per-cell spread (max/min) of the TTFT and TPOT medians is what a
user rerunning the sweep would see. The per-repeat samples (those rounds plus one longer run per
cell) are then bootstrapped: for n repeats, the expected max/min of three medians-of-n. The smallest
n under 5 % and the time per repeat give the recommended `measure.repeats` and
`measure.min_duration_s` (repeat until both are reached, capped by `measure.max_repeats`).

    python scripts/benchmarks/repeatability.py [--quick]
"""

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Section, device, fmt, markdown_table, median
from kvsweep.config.compose import compose_config
from kvsweep.grid import Cell, MeasureProtocol, expand_grid
from kvsweep.plan.cell_plan import package_installed, skip_reason
from kvsweep_testkit.cells import measure_cell

TITLE = "Repeatability: the quickstart grid measured three times"
ROUNDS = 3
NS = [2, 3, 5, 8, 10, 15, 20]
TARGET = 0.05
THREADS = 0  # torch threads per cell, as `measure.threads` (0: all cores); `--threads` overrides
BOOTSTRAP = 2000
METRICS = ("ttft", "tpot")


def protocol(warmup: int, repeats: int, dev: str) -> dict[str, Any]:
    """The protocol for `run_cell`: exactly `repeats` runs (no time floor, guard or target)."""
    return MeasureProtocol.exact(warmup, repeats, 0, dev, THREADS).to_dict()


def quickstart_cells(dev: str, quick: bool) -> tuple[list[Cell], int, int]:
    """The runnable cells of the quickstart sweep here (offloaded needs CUDA), and its warmup/repeats."""
    composed = compose_config(["+sweep=quickstart"]).config
    grid = dataclasses.asdict(composed.grid)
    if quick:  # one dtype and context: a smoke run
        grid.update(dtypes=grid["dtypes"][:1], context_lengths=grid["context_lengths"][:1])
    cells = [c for c in expand_grid(grid) if skip_reason(c, dev, None, package_installed) is None]
    return cells, composed.measure.warmup, composed.measure.repeats


def measure(cell: Cell, warmup: int, repeats: int, dev: str) -> dict[str, Any]:
    """One run_cell: its reported medians and the per-repeat (ttft, tpot, e2e) samples."""
    result = measure_cell(cell.to_dict(), protocol(warmup, repeats, dev))
    if result["status"] != "ok":
        raise RuntimeError(f"{cell.label}: {result['status']} {result.get('error')}")
    samples = [(r["ttft_ms"], sum(r["gaps_ms"]) / len(r["gaps_ms"]), r["e2e_ms"]) for r in result["samples"]["repeats"]]
    return {"ttft": result["metrics"]["ttft_ms"], "tpot": result["metrics"]["tpot_ms"], "samples": samples}


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1


def bootstrap_spread(pool: np.ndarray, n: int, rng: np.random.Generator) -> float:
    """Expected max/min − 1 of ROUNDS medians, each of n draws (with replacement) from the pool."""
    medians = np.median(pool[rng.integers(0, len(pool), size=(BOOTSTRAP, ROUNDS, n))], axis=2)
    return float(np.mean(medians.max(axis=1) / medians.min(axis=1) - 1))


def runs_for(repeats: int, duration: float, per_repeat: float, cap: int) -> int:
    """Repeats a cell gets under "at least `repeats` runs and `duration` seconds, at most `cap` runs"."""
    return min(cap, max(repeats, math.ceil(duration / per_repeat - 1e-9)))


def recommend(needed: list[int | None], seconds: list[float], cap: int) -> tuple[float, float, float]:
    """(repeats, min_duration_s, grid seconds): the cheapest count + duration rule giving every cell that can
    reach 5 % the repeats it needs. Durations tried: 0 and each cell's seconds-for-5 %. NaNs if none can."""
    covered = [(n, t) for n, t in zip(needed, seconds, strict=True) if n is not None]
    best: tuple[float, float, float] = (math.inf, math.nan, math.nan)
    for repeats in [n for n in NS if n >= 3]:  # a median of fewer than 3 runs is no median
        for duration in sorted({0.0} | {math.ceil(n * t * 10) / 10 for n, t in covered}):
            if covered and all(runs_for(repeats, duration, t, cap) >= n for n, t in covered):
                cost = sum(runs_for(repeats, duration, t, cap) * t for t in seconds)
                best = min(best, (cost, repeats, duration))
    return best[1], best[2], best[0]


def advice(rec_repeats: float, rec_duration: float, rec_cost: float, current: float, repeats: int) -> str:
    if math.isnan(rec_repeats):
        return (
            f"**No recommendation from this run:** no cell gets under 5 % even at {NS[-1]} repeats, so the spread "
            "measures this machine's load, not kvsweep; rerun on a quiet machine."
        )
    return (
        f"**Recommended defaults: `measure.repeats={rec_repeats:g}`, `measure.min_duration_s={rec_duration:g}`, "
        f"`measure.max_repeats={NS[-1]}`.** Each cell repeats until it has both {rec_repeats:g} runs and "
        f"{rec_duration:g} s of them. This is the cheapest count + duration rule (searched over n in {NS} and the "
        "cells' own 'seconds for 5 %') that gives every cell that can reach 5 % the repeats it needs: the count "
        "carries the slow cells, the duration the fast ones, whose noise comes in bursts a few runs miss (peers "
        "do the same: hyperfine ≥ 10 runs and ≥ 3 s, pytest-benchmark a minimum count and a time budget). "
        f"Measured time of this grid: {fmt(rec_cost, 1)} s against {fmt(current, 1)} s at {repeats} repeats."
    )


def run(quick: bool) -> Section:
    dev = device()
    cells, warmup, repeats = quickstart_cells(dev, quick)
    pool_repeats = 5 if quick else 10
    rounds: list[list[dict[str, Any]]] = []
    for k in range(ROUNDS):  # whole-grid rounds, like rerunning the sweep
        print(f"repeatability: round {k + 1} of {ROUNDS}, {len(cells)} cells", file=sys.stderr, flush=True)
        rounds.append([measure(cell, warmup, repeats, dev) for cell in cells])
    longer = [measure(cell, warmup, pool_repeats, dev) for cell in cells]
    rng = np.random.default_rng(0)
    rows: list[list[str]] = []
    needed: list[int | None] = []  # repeats each cell needs for 5 % (None: out of reach at NS[-1])
    seconds: list[float] = []  # measured time per repeat
    curve: dict[str, dict[int, list[float]]] = {m: {n: [] for n in NS} for m in METRICS}
    worst = {m: 0.0 for m in METRICS}
    for i, cell in enumerate(cells):
        samples = [s for r in rounds for s in r[i]["samples"]] + longer[i]["samples"]
        observed = {m: spread([r[i][m] for r in rounds]) for m in METRICS}
        expected: dict[str, dict[int, float]] = {m: {} for m in METRICS}
        for k, m in enumerate(METRICS):
            worst[m] = max(worst[m], observed[m])
            pool = np.array([s[k] for s in samples])
            for n in NS:
                expected[m][n] = bootstrap_spread(pool, n, rng)
                curve[m][n].append(expected[m][n])
        n_needed = next((n for n in NS if max(expected[m][n] for m in METRICS) < TARGET), None)
        per_repeat = median([s[2] for s in samples]) / 1000
        needed.append(n_needed)
        seconds.append(per_repeat)
        rows.append([
            f"{cell.dtype} ctx={cell.context_length} {cell.cache}", fmt(100 * observed["ttft"], 1),
            fmt(100 * observed["tpot"], 1), fmt(100 * expected["ttft"][repeats], 1),
            fmt(100 * expected["tpot"][repeats], 1),
            fmt(per_repeat, 3), str(n_needed) if n_needed else f"> {NS[-1]}", fmt((n_needed or NS[-1]) * per_repeat, 2),
        ])  # fmt: skip
    unreachable = sum(n is None for n in needed)
    rec_repeats, rec_duration, rec_cost = recommend(needed, seconds, NS[-1])
    current = sum(repeats * t for t in seconds)
    met = sum(n is not None and n <= repeats for n in needed)
    curve_rows = [
        [str(n)] + [fmt(100 * f(curve[m][n]), 1) for m in METRICS for f in (median, max)] for n in NS
    ]  # fmt: skip
    figures = {
        "cells": len(cells),
        "worst_ttft_spread": round(worst["ttft"], 4),
        "worst_tpot_spread": round(worst["tpot"], 4),
        "median_ttft_spread": round(median([spread([r[i]["ttft"] for r in rounds]) for i in range(len(cells))]), 4),
        "median_tpot_spread": round(median([spread([r[i]["tpot"] for r in rounds]) for i in range(len(cells))]), 4),
        "cells_under_5pct_at_quickstart_repeats": met,
        "cells_unreachable_at_20": unreachable,
        "recommended_repeats": rec_repeats,
        "recommended_min_duration_s": rec_duration,
        "recommended_max_repeats": NS[-1],
    }
    markdown = "\n".join([
        f"{len(cells)} runnable cells of `sweeps/quickstart.yaml` on {dev} (offloaded skipped without CUDA), "
        f"torch threads {THREADS or 'all cores'}, "
        f"measured by `run_cell` in this process, {ROUNDS} whole-grid rounds with the quickstart protocol "
        f"(warmup {warmup}, repeats {repeats}). Spread = max/min − 1 of a cell's medians over the rounds. "
        f"*Predicted* = bootstrap of the same from the cell's {ROUNDS * repeats + pool_repeats} per-repeat samples "
        f"(the rounds plus one run of {pool_repeats}); *n for 5 %* = smallest n whose predicted TTFT and TPOT "
        "spreads are both under 5 %.",
        "",
        markdown_table(
            ["cell", "TTFT spread %", "TPOT spread %", f"predicted TTFT % (n={repeats})",
             f"predicted TPOT % (n={repeats})", "s per repeat", "n for 5 %", "s for 5 %"], rows),
        "",
        "Predicted spread (%) against n, median and worst over cells:",
        "",
        markdown_table(["n", "TTFT median", "TTFT worst", "TPOT median", "TPOT worst"], curve_rows),
        "",
        f"Worst observed spread: TTFT {fmt(100 * worst['ttft'], 1)} %, TPOT {fmt(100 * worst['tpot'], 1)} %; "
        f"{met} of {len(cells)} cells are predicted under 5 % at the quickstart's {repeats} repeats, "
        f"{unreachable} not even at {NS[-1]} (their noise floor here; they run what the rule gives them).",
        "",
        advice(rec_repeats, rec_duration, rec_cost, current, repeats),
    ])  # fmt: skip
    return Section(markdown, figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one dtype and context, a shorter pool: a smoke run")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per cell (0: all cores)")
    args = parser.parse_args()
    THREADS = args.threads
    started = time.time()
    section = run(args.quick)
    print(section.markdown)
    print(f"\nfigures: {section.figures}\n({time.time() - started:.0f} s)")
