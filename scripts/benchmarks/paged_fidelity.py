"""Does a `paged` cell report the times continuous batching really takes?

kvsweep's side is `run_cell` on a `paged` cell (its manager's thread serving the batch, TTFT and TPOT from the
manager's own per-token stamps). The bare side drives a manager of the same pool step by step in this process,
without its thread, and stamps each step here with `perf_counter`: every step of a batch of same-length
prompts makes one token for every row, so step 1 ends the prefill and each later step is one decode gap.
Interleaved A/B, so drift on a shared machine hits both sides alike.

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

TITLE = "Paged fidelity: a paged cell's clock against a hand-stepped continuous batching loop"
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


def bare_block(model: Any, rows: list[list[int]], repeats: int) -> dict[str, float]:
    stepped_call(model, rows)  # warmup, as the cell's
    calls = [stepped_call(model, rows) for _ in range(repeats)]
    return {"ttft_ms": median([c[0] for c in calls]), "tpot_ms": median([c[1] for c in calls])}


def run(quick: bool) -> Section:
    pairs, repeats = (3, 3) if quick else (10, 5)
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    model = build_model(classify(MODEL), DTYPE, "cpu", SEED)
    rows = random_ids(model.config.vocab_size, BATCH, CONTEXT, SEED).tolist()
    stepped_call(model, rows)  # the bare side's cold call, outside the pairs
    ours, bare = [], []
    for i in range(pairs):  # ABBA
        for side in ("kvsweep", "bare") if i % 2 == 0 else ("bare", "kvsweep"):
            if side == "kvsweep":
                ours.append(kvsweep_block(repeats, threads))
            else:
                bare.append(bare_block(model, rows, repeats))
            torch.set_num_threads(threads)
    figures, row = {}, ["paged"]
    for metric in ("ttft_ms", "tpot_ms"):
        a, b = median([o[metric] for o in ours]), median([r[metric] for r in bare])
        paired = median([o[metric] / r[metric] for o, r in zip(ours, bare, strict=True)])
        figures[f"paged_{metric.removesuffix('_ms')}_ratio"] = round(ratio(a, b), 4)
        figures[f"paged_{metric.removesuffix('_ms')}_paired_ratio"] = round(paired, 4)
        row += [fmt(a, 2), fmt(b, 2), fmt(ratio(a, b)), fmt(paired)]
    worst = max(abs(figures[f"paged_{m}_ratio"] - 1) for m in ("ttft", "tpot"))
    header = ["cache", "kvsweep TTFT ms", "stepped TTFT ms", "TTFT ratio", "paired"]
    header += ["kvsweep TPOT ms", "stepped TPOT ms", "TPOT ratio", "paired"]
    markdown = "\n".join([
        f"{MODEL}, {DTYPE}, context {CONTEXT}, {NEW} new tokens, batch {BATCH}, on cpu with {threads} threads; the "
        "cell's own pool (256-token pages, each row's cached tokens). "
        f"{pairs} interleaved pairs (ABBA); each side is a warmup, then the median of {repeats} calls. kvsweep's "
        "side: `run_cell` on a `paged` cell (the manager's thread serves, its per-token stamps time). The stepped "
        "side: a manager of the same pool driven step by step in this process, each step stamped here.",
        "",
        markdown_table(header, [row]),
        "",
        f"Worst |ratio − 1| = {fmt(worst)} (the runner's fidelity target is 0.03: "
        f"{'met' if worst <= 0.03 else 'missed'}). What kvsweep's side adds: the hand-off of each request to the "
        "manager's thread and back, which a server pays too.",
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
