"""Scheduling at scale: trivial cells on simulated clusters of 1 to 16 logical GPUs, and a 2,000-cell driver.

Each measurement starts a Ray cluster on this machine (`ray.cluster_utils.Cluster`, up to 8 logical
GPUs per node) and runs a grid of stand-in cells (`+testing.runner=kvsweep.testing.stand_ins:sleep_cell`,
which sleeps instead of measuring) through the real sweep path: plan, one fresh actor per cell,
journal, MLflow on sqlite. Makespan is the scheduler's window (first cell submitted to last result);
the ideal is cells x sleep / GPUs; efficiency = ideal / makespan.

Every cell still starts a fresh Python process (Ray worker boot, ~1 CPU-second): on a 2-core machine
16 GPUs cannot turn over faster than the two cores start processes, so efficiency depends on how long
a cell is. The benchmark reports that dependence at 16 GPUs, then the size series at one duration,
then the driver's memory and CPU time per cell on a 2,000-cell grid (16 GPUs).

    python scripts/benchmarks/scaling.py [--quick]
    python scripts/benchmarks/scaling.py --one --gpus 16 --rounds 2 --sleep-s 20   # one measurement
    python scripts/benchmarks/scaling.py --one --gpus 16 --cells 2000 --sleep-s 0.5
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QUIET, Section, fmt, markdown_table

TITLE = "Scaling: stand-in cells on simulated clusters of 1-16 GPUs; driver cost on 2,000 cells"

GPUS_PER_NODE = 8


def axes_for(cells: int, gpus: int, rounds: int) -> list[str]:
    """Grid axes with exactly `gpus x rounds` cells, or at least `cells` when that is given."""
    if cells:
        side = math.ceil(cells ** (1 / 3))
        contexts, batches = [64 + i for i in range(side)], list(range(1, side + 1))
        news = list(range(1, math.ceil(cells / (side * side)) + 1))
    else:
        contexts, batches, news = [64 + i for i in range(gpus)], [1], list(range(1, rounds + 1))
    return [
        f"grid.context_lengths=[{','.join(map(str, contexts))}]",
        f"grid.batch_sizes=[{','.join(map(str, batches))}]",
        f"grid.max_new_tokens=[{','.join(map(str, news))}]",
    ]


# -- one measurement, in its own process (a fresh driver, a fresh cluster)
def one(gpus: int, rounds: int, cells: int, sleep_s: float, extra: list[str]) -> dict:
    os.environ.update(QUIET)
    import psutil
    from ray.cluster_utils import Cluster

    from kvsweep.cli import main as kvsweep
    from kvsweep.driver import scheduler

    nodes = max(1, math.ceil(gpus / GPUS_PER_NODE))
    per_node = gpus // nodes
    node_args = {"num_cpus": per_node, "num_gpus": per_node, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**node_args)
    cluster.wait_for_nodes()

    window: dict[str, float] = {}
    original_run = scheduler.CellScheduler.run

    def timed_run(self, *args, **kwargs):
        window["start"] = time.monotonic()
        window["cpu_start"] = sum(psutil.Process().cpu_times()[:2])
        try:
            return original_run(self, *args, **kwargs)
        finally:
            window["end"] = time.monotonic()
            window["cpu_end"] = sum(psutil.Process().cpu_times()[:2])

    scheduler.CellScheduler.run = timed_run
    process = psutil.Process()
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            samples.append((time.monotonic(), process.memory_info().rss))

    threading.Thread(target=sample, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            "grid.models=[tiny-llama]",
            "grid.dtypes=[bfloat16]",
            "grid.caches=[dynamic]",
            *axes_for(cells, gpus, rounds),
            f"ray.address={cluster.address}",
            "+testing.runner=kvsweep.testing.stand_ins:sleep_cell",
            f"+testing.sleep_s={sleep_s}",
            f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db",
            f"hydra.run.dir={tmp}/run",
            "infer_oom=false",
            *extra,
        ]
        started = time.monotonic()
        code = kvsweep(overrides)
        wall = time.monotonic() - started
        results = [
            json.loads(line)["result"]
            for line in Path(f"{tmp}/run/journal.jsonl").read_text().splitlines()
            if '"kind": "cell"' in line
        ]
    done.set()
    cluster.shutdown()
    n = len(results)
    makespan = window["end"] - window["start"]
    ideal = n * sleep_s / gpus
    # Actor start: from the driver's request (or the worker process's start, if later) to the actor
    # being ready; Ray's idle prestarted workers (started with the node) make the first ones quick.
    boots = [
        t["actor_init_at"] - max(t["process_started_at"], t["requested_at"])
        for t in (r["environment"].get("timeline", {}) for r in results)
        if "process_started_at" in t and "actor_init_at" in t
    ]
    during = [(t, rss) for t, rss in samples if window["start"] <= t <= window["end"]]
    quarter = next((rss for t, rss in during if t >= window["start"] + makespan / 4), during[0][1] if during else 0)
    return {
        "gpus": gpus,
        "nodes": nodes,
        "cells": n,
        "sleep_s": sleep_s,
        "exit": code,
        "statuses": sorted({r["status"] for r in results}),
        "wall_s": wall,
        "makespan_s": makespan,
        "ideal_s": ideal,
        "efficiency": ideal / makespan if makespan else 0.0,
        "overhead_per_cell_s": makespan * gpus / max(1, n) - sleep_s,
        "actor_start_median_s": sorted(boots)[len(boots) // 2] if boots else float("nan"),
        "driver_cpu_per_cell_ms": (window["cpu_end"] - window["cpu_start"]) / max(1, n) * 1e3,
        "driver_peak_rss_mib": max(rss for _, rss in samples) / 2**20 if samples else 0.0,
        "driver_growth_mib_per_1000": ((during[-1][1] - quarter) / 2**20 / (0.75 * n) * 1000) if during else 0.0,
    }


def measure(gpus: int, sleep_s: float, rounds: int = 0, cells: int = 0, extra: list[str] | None = None) -> dict:
    """`one` in a child process; returns its figures."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    command = [sys.executable, __file__, "--one", "--json", f"--gpus={gpus}", f"--sleep-s={sleep_s}"]
    command += [f"--rounds={rounds}", f"--cells={cells}", *(f"--extra={e}" for e in extra or [])]
    print(f"  {gpus} GPUs, {rounds or cells} {'rounds' if rounds else 'cells'} of {sleep_s:g} s ...", flush=True)
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"scaling run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    figures = json.loads(lines[-1])
    print(
        f"    makespan {figures['makespan_s']:.1f} s, ideal {figures['ideal_s']:.1f} s, "
        f"efficiency {figures['efficiency']:.2f}",
        flush=True,
    )
    return figures


def run(quick: bool) -> Section:
    durations = [3.0, 15.0] if quick else [2.0, 5.0, 10.0, 20.0, 40.0]
    chosen = 15.0 if quick else 40.0
    rounds = 1 if quick else 2
    by_duration = [measure(16, s, rounds=rounds) for s in durations if s != chosen]
    sizes = [measure(g, chosen, rounds=rounds) for g in (1, 2, 4, 8, 16)]
    by_duration = sorted([*by_duration, sizes[-1]], key=lambda f: f["sleep_s"])
    big = measure(16, 0.5, cells=150 if quick else 2000)
    return section(by_duration, sizes, big, rounds)


def section(by_duration: list[dict], sizes: list[dict], big: dict, rounds: int) -> Section:
    def row(f: dict, first: str) -> list[str]:
        return [
            first,
            str(f["cells"]),
            fmt(f["makespan_s"], 1),
            fmt(f["ideal_s"], 1),
            f"**{fmt(f['efficiency'], 2)}**",
            fmt(f["overhead_per_cell_s"], 2),
            fmt(f["actor_start_median_s"], 2),
        ]

    header = ["", "cells", "makespan s", "ideal s", "efficiency", "GPU-s per cell beyond the sleep", "actor start s"]
    chosen = sizes[-1]["sleep_s"]
    figures: dict[str, float] = {}
    for f in sizes:
        figures[f"efficiency.gpus_{f['gpus']}"] = f["efficiency"]
    for f in by_duration:
        figures[f"efficiency.gpus_16.sleep_{f['sleep_s']:g}s"] = f["efficiency"]
    figures.update(
        {
            "big.cells": big["cells"],
            "big.driver_cpu_per_cell_ms": big["driver_cpu_per_cell_ms"],
            "big.driver_peak_rss_mib": big["driver_peak_rss_mib"],
            "big.driver_growth_mib_per_1000": big["driver_growth_mib_per_1000"],
            "big.makespan_per_cell_ms": big["makespan_s"] / big["cells"] * 1e3,
            "big.efficiency": big["efficiency"],
        }
    )
    text = [
        f"Stand-in cells (sleep instead of measuring) through the real sweep path on clusters simulated on this "
        f"machine ({GPUS_PER_NODE} logical GPUs per node, one cell per GPU); {rounds} cells per GPU. Every cell is "
        "a fresh Ray worker process, so each costs about a CPU-second to start whatever the cluster's size.",
        "",
        f"**By cluster size** ({chosen:g} s cells):",
        "",
        markdown_table(["GPUs", *header[1:]], [row(f, str(f["gpus"])) for f in sizes]),
        "",
        "**By cell duration** (16 GPUs): the per-cell start cost is fixed, so short cells waste a larger share.",
        "",
        markdown_table(["cell s", *header[1:]], [row(f, f"{f['sleep_s']:g}") for f in by_duration]),
        "",
        f"**Driver on a big grid:** {big['cells']} cells of {big['sleep_s']:g} s on 16 GPUs: the driver used "
        f"{fmt(big['driver_cpu_per_cell_ms'], 1)} ms of CPU per cell (planning, actor calls, journal, MLflow), peaked "
        f"at {big['driver_peak_rss_mib']:.0f} MiB RSS and grew {fmt(big['driver_growth_mib_per_1000'], 1)} MiB per "
        f"1,000 cells; makespan {big['makespan_s']:.0f} s ({big['makespan_s'] / big['cells'] * 1e3:.0f} ms per cell, "
        f"efficiency {fmt(big['efficiency'], 2)}: here the two cores starting worker processes are the limit).",
    ]
    return Section("\n".join(text), figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--one", action="store_true", help="one measurement with the options below")
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="cells per GPU")
    parser.add_argument("--cells", type=int, default=0, help="at least this many cells instead of --rounds")
    parser.add_argument("--sleep-s", type=float, default=20.0)
    parser.add_argument("--extra", action="append", default=[], help="another kvsweep override")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    if args.one:
        figures = one(args.gpus, args.rounds, args.cells, args.sleep_s, args.extra)
        print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))
        return
    result = run(args.quick)
    print(result.markdown)


if __name__ == "__main__":
    main()
