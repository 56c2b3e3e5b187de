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
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Section, fmt, markdown_table, median, ratio
from kvsweep.caches import get_strategy
from kvsweep.caches.paged_pool import pool_for
from kvsweep.cell.call_inputs import random_ids
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.build import build_model
from kvsweep.models.resolve import classify
from kvsweep_testkit.cells import measure_cell

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
    """One batch through a manager driven step by step, each step stamped here: (TTFT ms, TPOT ms)."""
    pool = pool_for(get_strategy("paged"), BATCH, CONTEXT, cell().cached_tokens)  # the cell's own pool
    config = ContinuousBatchingConfig(
        page_size=pool.page_size,
        num_blocks=pool.blocks,
        max_batch_tokens=pool.max_batch_tokens,
        allow_block_sharing=False,
        max_memory_percent=1.0,
    )
    generation = GenerationConfig(do_sample=False, max_new_tokens=NEW, eos_token_id=-1)
    manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=config)
    processor = manager.batch_processor = manager._create_batch_processor()
    stamps = []
    with torch.inference_mode():
        started = time.perf_counter()
        for i, row in enumerate(rows):
            manager.add_request(row, request_id=f"r{i}", max_new_tokens=NEW)
        while processor.prepare_next_batch():
            manager._generation_step()
            processor.update_batch()
            stamps.append(time.perf_counter())
    manager.stop()
    if len(stamps) != NEW:
        raise RuntimeError(f"the stepped loop took {len(stamps)} steps for {NEW} tokens a row")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return (stamps[0] - started) * 1e3, sum(gaps) / len(gaps) * 1e3  # a call's TPOT: its mean gap, as the cell's


def batch_call(model: Any, rows: list[list[int]]) -> tuple[float, float]:
    """One `generate_batch` call, timed from its outputs' stamps as the cell times its calls: (TTFT ms, TPOT ms)."""
    pool = pool_for(get_strategy("paged"), BATCH, CONTEXT, cell().cached_tokens)
    config = ContinuousBatchingConfig(
        page_size=pool.page_size,
        num_blocks=pool.blocks,
        max_batch_tokens=pool.max_batch_tokens,
        allow_block_sharing=False,
        max_memory_percent=1.0,
        auto_switch_to_flash=False,
    )
    generation = GenerationConfig(do_sample=False, max_new_tokens=NEW, eos_token_id=-1)
    outputs = list(
        model.generate_batch(
            rows,
            generation_config=generation,
            continuous_batching_config=config,
            record_timestamps=True,
            progress_bar=False,
        ).values()
    )
    stamps = [max(o.timestamps[k] for o in outputs) for k in range(NEW)]
    started = min(o.created_time for o in outputs)
    return (stamps[0] - started) * 1e3, (stamps[-1] - stamps[0]) / (NEW - 1) * 1e3


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
