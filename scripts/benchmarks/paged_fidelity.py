"""Does a `paged` cell report the times Transformers' continuous batching really takes?

kvsweep's side is `run_cell` on a `paged` cell: one manager serves the cell (its background thread), and TTFT and
TPOT come from the manager's own per-token stamps. The reference is `generate_batch` on the same prompts and
pool, timed the same way from its outputs' stamps (`record_timestamps`), its own manager started and stopped
around each call. A third column drives a manager of the same pool step by step in this process, without its
thread, each step stamped here: what the engine's steps cost when no thread hands them over. Interleaved A/B,
so drift on a shared machine hits every side alike.

    python scripts/benchmarks/paged_fidelity.py [--quick]
"""

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Section, fmt, markdown_table, median, ratio
from kvsweep.cell.call_inputs import random_ids
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.build import build_model
from kvsweep.models.resolve import classify
from kvsweep_testkit.cells import measure_cell
from kvsweep_testkit.paged import generate_batch_times, stepped_times

TITLE = "Paged fidelity: a paged cell's clock against Transformers' generate_batch"
MODEL, DTYPE, CONTEXT, NEW, BATCH, SEED = "tiny-llama", "float32", 256, 32, 2, 0


def cell() -> Cell:
    return Cell(MODEL, DTYPE, CONTEXT, BATCH, NEW, "paged", False)


def kvsweep_block(repeats: int, threads: int) -> dict[str, float]:
    proto = MeasureProtocol.exact(1, repeats, SEED, "cpu", threads).to_dict()
    result = measure_cell(cell().to_dict(), proto)
    if result["status"] != "ok":
        raise RuntimeError(f"kvsweep paged cell: {result['status']} {result.get('error')}")
    return {k: result["metrics"][k] for k in ("ttft_ms", "tpot_ms")}


def stepped_call(model: Any, rows: list[list[int]]) -> tuple[float, float]:
    return stepped_times(model, rows, NEW)


def batch_call(model: Any, rows: list[list[int]]) -> tuple[float, float]:
    return generate_batch_times(model, rows, NEW)


def block(call: Any, model: Any, rows: list[list[int]], repeats: int) -> dict[str, float]:
    call(model, rows)  # warmup, as the cell's
    calls = [call(model, rows) for _ in range(repeats)]
    return {"ttft_ms": median([c[0] for c in calls]), "tpot_ms": median([c[1] for c in calls])}


def run(quick: bool) -> Section:
    pairs, repeats = (3, 3) if quick else (8, 5)
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    model = build_model(classify(MODEL), DTYPE, "cpu", SEED)
    rows = random_ids(model.config.vocab_size, BATCH, CONTEXT, SEED).tolist()
    batch_call(model, rows), stepped_call(model, rows)  # cold calls, outside the pairs
    sides: dict[str, list[dict[str, float]]] = {"kvsweep": [], "generate_batch": [], "stepped": []}
    for i in range(pairs):  # rotated order, so no side always runs first
        order = list(sides)[i % 3 :] + list(sides)[: i % 3]
        for side in order:
            if side == "kvsweep":
                sides[side].append(kvsweep_block(repeats, threads))
            else:
                sides[side].append(
                    block(batch_call if side == "generate_batch" else stepped_call, model, rows, repeats)
                )
            torch.set_num_threads(threads)
    figures, rows_out = {}, []
    for metric in ("ttft_ms", "tpot_ms"):
        ours, ref, stepped = (median([s[metric] for s in sides[k]]) for k in sides)
        paired = median([o[metric] / r[metric] for o, r in zip(sides["kvsweep"], sides["generate_batch"], strict=True)])
        name = metric.removesuffix("_ms")
        figures[f"paged_{name}_ratio"] = round(ratio(ours, ref), 4)
        figures[f"paged_{name}_paired_ratio"] = round(paired, 4)
        figures[f"paged_{name}_thread_cost"] = round(ratio(ref, stepped), 4)
        rows_out.append([name.upper(), fmt(ours, 2), fmt(ref, 2), fmt(ratio(ours, ref)), fmt(paired), fmt(stepped, 2)])
    worst = max(abs(figures[f"paged_{m}_ratio"] - 1) for m in ("ttft", "tpot"))
    header = ["", "kvsweep ms", "generate_batch ms", "ratio", "paired", "stepped, no thread ms"]
    markdown = "\n".join([
        f"{MODEL}, {DTYPE}, context {CONTEXT}, {NEW} new tokens, batch {BATCH}, on cpu with {threads} threads; the "
        "cell's own pool (256-token pages, each row's cached tokens). "
        f"{pairs} rounds, the three sides in rotated order; each side is a warmup, then the median of {repeats} "
        "calls. kvsweep: `run_cell` on a `paged` cell (one manager for the cell, its thread serving, its per-token "
        "stamps). generate_batch: Transformers' own call on the same prompts and pool, timed from its outputs' "
        "stamps. Stepped: a manager of the same pool driven step by step in this process, no thread.",
        "",
        markdown_table(header, rows_out),
        "",
        f"Worst |ratio − 1| against generate_batch = {fmt(worst)} (the runner's fidelity target is 0.03: "
        f"{'met' if worst <= 0.03 else 'missed'}). Transformers' manager thread itself costs "
        f"{fmt(figures['paged_tpot_thread_cost'])}× the stepped loop's TPOT here (generate_batch ÷ stepped): "
        "the price of continuous batching's background thread on this CPU, which kvsweep reports as Transformers "
        "serves it. TTFT differs where the TPOT agrees because each generate_batch call starts a manager of its own "
        "(its thread and first step fresh), while a cell's calls share one started manager, as a server's requests "
        "do.",
    ])  # fmt: skip
    return Section(markdown, figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer pairs: a smoke run")
    args = parser.parse_args()
    started = time.time()
    section = run(args.quick)
    print(section.markdown)
    print(f"\nfigures: {section.figures}\n({time.time() - started:.0f} s)")
