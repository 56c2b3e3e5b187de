"""Does the contention guard keep a sweep's numbers where a quiet machine puts them?

Four small cells (tiny-llama float32, dynamic and static, contexts 256 and 1024) are measured by
`run_cell` in this process under five conditions, one after another:

- *clean*: nothing else running, guard on (the defaults);
- *bursty, guard off*: one CPU burner per core, spinning 1 s then sleeping 2 s (a periodic
  background job), `measure.max_host_contention=1` (off);
- *bursty, guard on*: the same burners, default guard: calls that saw them are discarded and re-run;
- *steady, guard on*: burners that never stop: the guard cannot wait them out, so the cells must
  end tagged `kvsweep.contended=true`;
- *clean again*: the machine's own drift over the run, for scale.

A medians "holds" when it lies inside the clean run's own 95% interval. A calibration then runs one
cell beside burners of growing duty cycle with the guard off, to see what share of the CPUs others
may take before the medians move outside that interval: the evidence for the default limit.

    python scripts/benchmarks/contention.py [--quick]
"""

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Section, fmt, markdown_table
from kvsweep.config.schema import MeasureConfig
from kvsweep.measure.contention import HostMeter
from kvsweep.runner import run_cell

TITLE = "Contention: a small sweep beside a CPU burner, with and without the guard"
DEFAULTS = MeasureConfig()
BASE = {"warmup": 1, "repeats": DEFAULTS.repeats, "seed": 0, "device": "cpu", "threads": 0}
BASE |= {"min_duration_s": DEFAULTS.min_duration_s, "max_repeats": DEFAULTS.max_repeats}
BASE |= {"max_duration_s": DEFAULTS.max_duration_s}
GUARD_ON = {"max_host_contention": DEFAULTS.max_host_contention, "max_discarded": DEFAULTS.max_discarded}
GUARD_OFF = {"max_host_contention": 1.0, "max_discarded": 0}
BURST_ON_S, BURST_OFF_S = 2.0, 2.0
DUTIES = (0.05, 0.1, 0.2, 0.4)  # calibration: share of each 20 ms period a burner spins
BURNER = """
import sys, time
on, off = float(sys.argv[1]), float(sys.argv[2])
while True:
    end = time.monotonic() + on
    while time.monotonic() < end:
        pass
    if off:
        time.sleep(off)
"""


def cells(quick: bool) -> list[dict[str, Any]]:
    contexts = [256] if quick else [256, 1024]
    return [
        {"model": "tiny-llama", "dtype": "float32", "context_length": ctx, "batch_size": 1, "max_new_tokens": 32,
         "cache": cache, "compile": False}
        for ctx in contexts for cache in ("dynamic", "static")
    ]  # fmt: skip


@contextmanager
def burners(on_s: float, off_s: float) -> Iterator[None]:
    """One burner per CPU this process may use, spinning `on_s` then sleeping `off_s`, until the block ends."""
    procs = [
        subprocess.Popen([sys.executable, "-c", BURNER, str(on_s), str(off_s)])
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    try:
        time.sleep(0.3)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def measure(cell: dict[str, Any], guard: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    result = run_cell(cell, BASE | guard)
    if result["status"] != "ok":
        raise RuntimeError(f"{cell['cache']} ctx={cell['context_length']}: {result['status']} {result['error']}")
    return {**result["metrics"], "tags": result["tags"], "wall_s": time.perf_counter() - started}


def run_condition(name: str, grid: list[dict[str, Any]], guard: dict[str, Any]) -> list[dict[str, Any]]:
    print(f"contention: {name}", file=sys.stderr, flush=True)
    return [measure(cell, guard) for cell in grid]


def holds(value: float, clean: dict[str, Any], metric: str) -> bool:
    return clean[f"{metric}_ci_low"] <= value <= clean[f"{metric}_ci_high"]


def shift(value: float, clean: dict[str, Any], metric: str) -> str:
    mark = "" if holds(value, clean, metric) else " ✗"
    return f"{100 * (value / clean[metric] - 1):+.0f}%{mark}"


def meter_cost_us(pairs: int = 2000) -> float:
    meter = HostMeter()
    started = time.perf_counter()
    for _ in range(pairs):
        meter.start()
        meter.stop()
    return (time.perf_counter() - started) / pairs * 1e6


def calibrate(cell: dict[str, Any], clean: dict[str, Any]) -> list[list[str]]:
    rows = []
    for duty in DUTIES:
        period = 0.02
        with burners(duty * period, (1 - duty) * period):
            m = measure(cell, GUARD_OFF)
        rows.append([
            f"{duty:.0%}", fmt(m["host_other_cpu_share"], 3), shift(m["tpot_ms"], clean, "tpot_ms"),
            shift(m["ttft_ms"], clean, "ttft_ms"),
        ])  # fmt: skip
    return rows


def run(quick: bool) -> Section:
    grid = cells(quick)
    clean = run_condition("clean", grid, GUARD_ON)
    with burners(BURST_ON_S, BURST_OFF_S):
        bursty_off = run_condition("bursty burner, guard off", grid, GUARD_OFF)
    with burners(BURST_ON_S, BURST_OFF_S):
        bursty_on = run_condition("bursty burner, guard on", grid, GUARD_ON)
    with burners(1.0, 0.0):
        steady_on = run_condition("steady burner, guard on", grid, GUARD_ON)
    again = run_condition("clean again", grid, GUARD_ON)
    calibration = calibrate(grid[-1], clean[-1])

    rows = []
    for i, cell in enumerate(grid):
        c = clean[i]
        rows.append([
            f"{cell['cache']} ctx={cell['context_length']}",
            f"{fmt(c['tpot_ms'], 2)} [{fmt(c['tpot_ms_ci_low'], 2)}-{fmt(c['tpot_ms_ci_high'], 2)}]",
            shift(again[i]["tpot_ms"], c, "tpot_ms"),
            shift(bursty_off[i]["tpot_ms"], c, "tpot_ms"), shift(bursty_off[i]["ttft_ms"], c, "ttft_ms"),
            shift(bursty_on[i]["tpot_ms"], c, "tpot_ms"), shift(bursty_on[i]["ttft_ms"], c, "ttft_ms"),
            f"{bursty_on[i]['discarded_calls']:.0f}", bursty_on[i]["tags"]["kvsweep.contended"],
            f"{steady_on[i]['tags']['kvsweep.contended']} ({fmt(steady_on[i]['host_other_cpu_share'], 2)})",
        ])  # fmt: skip
    held = {
        name: sum(holds(r[i][m], clean[i], m) for i in range(len(grid)) for m in ("tpot_ms", "ttft_ms"))
        for name, r in (("again", again), ("bursty_off", bursty_off), ("bursty_on", bursty_on))
    }
    conditions = {"clean": clean, "bursty_off": bursty_off, "bursty_on": bursty_on, "steady_on": steady_on}
    walls = {name: sum(m["wall_s"] for m in r) for name, r in conditions.items()}
    worst = {
        name: max(abs(r[i][m] / clean[i][m] - 1) for i in range(len(grid)) for m in ("tpot_ms", "ttft_ms"))
        for name, r in (("again", again), ("bursty_off", bursty_off), ("bursty_on", bursty_on))
    }
    total = 2 * len(grid)
    cost = meter_cost_us()
    figures = {
        "medians_held_clean_again": held["again"],
        "medians_held_bursty_guard_off": held["bursty_off"],
        "medians_held_bursty_guard_on": held["bursty_on"],
        "medians_compared": total,
        "worst_shift_clean_again": round(worst["again"], 3),
        "worst_shift_bursty_guard_off": round(worst["bursty_off"], 3),
        "worst_shift_bursty_guard_on": round(worst["bursty_on"], 3),
        "steady_cells_tagged": sum(m["tags"]["kvsweep.contended"] == "true" for m in steady_on),
        "guard_wall_ratio_bursty": round(walls["bursty_on"] / walls["bursty_off"], 3),
        "clean_other_share_median": round(sorted(m["host_other_cpu_share"] for m in clean)[len(clean) // 2], 4),
        "meter_us_per_call": round(cost, 1),
    }
    markdown = "\n".join([
        f"{len(grid)} cells (tiny-llama float32, dynamic and static) measured by `run_cell` with the default "
        f"protocol (repeats {BASE['repeats']}, min_duration_s {BASE['min_duration_s']}, max_repeats "
        f"{BASE['max_repeats']}); guard = `measure.max_host_contention={GUARD_ON['max_host_contention']}`, "
        f"`measure.max_discarded={GUARD_ON['max_discarded']}`. Burners: one CPU-bound process per core; "
        f"*bursty* spins {BURST_ON_S:g} s and sleeps {BURST_OFF_S:g} s, *steady* never sleeps. Shifts are against "
        "the clean run's median; ✗ = outside the clean run's 95% interval.",
        "",
        markdown_table(
            ["cell", "clean TPOT ms [95% CI]", "clean again TPOT", "bursty, guard off: TPOT", "TTFT",
             "bursty, guard on: TPOT", "TTFT", "discarded", "contended", "steady, guard on: contended (share)"],
            rows),
        "",
        f"Medians inside the clean interval (TPOT and TTFT, {total} in all): clean again {held['again']}, "
        f"bursty with the guard off {held['bursty_off']}, bursty with the guard on {held['bursty_on']}. "
        f"Worst shift of a median: clean again {worst['again']:.0%}, bursty with the guard off "
        f"{worst['bursty_off']:.0%}, with the guard on {worst['bursty_on']:.0%}. "
        f"Steady burner: {figures['steady_cells_tagged']} of {len(grid)} cells tagged contended. Wall time of the "
        f"bursty condition with the guard on / off: {fmt(figures['guard_wall_ratio_bursty'], 2)}x "
        f"(clean {fmt(walls['clean'], 1)} s, bursty off {fmt(walls['bursty_off'], 1)} s, bursty on "
        f"{fmt(walls['bursty_on'], 1)} s, steady on {fmt(walls['steady_on'], 1)} s). On a clean host the guard "
        f"costs two reads of /proc/stat per call: {fmt(cost, 1)} µs. kvsweep's own background (Ray, this "
        f"process's other threads) reads as {fmt(figures['clean_other_share_median'], 3)} of the CPUs (median "
        "over the clean cells).",
        "",
        f"Calibration: {grid[-1]['cache']} ctx={grid[-1]['context_length']} with the guard off beside one burner "
        "per core spinning the given share of every 20 ms:",
        "",
        markdown_table(["burner duty", "host_other_cpu_share", "TPOT shift", "TTFT shift"], calibration),
    ])  # fmt: skip
    return Section(markdown, figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two cells: a smoke run")
    print(run(parser.parse_args().quick).markdown)
