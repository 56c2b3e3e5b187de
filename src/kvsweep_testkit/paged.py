"""Continuous batching driven by hand, for the tests and the benchmark that check a `paged` cell's clock.

Both build Transformers' manager with the pool a `paged` cell asks for (`caches.paged_pool`), and time one batch
either through `generate_batch` (its outputs' stamps) or by stepping the engine in the calling thread.
"""

import itertools
import time
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig

from kvsweep.caches import get_strategy
from kvsweep.caches.paged_pool import pool_for


def cell_pool_config(rows: list[list[int]], new: int) -> ContinuousBatchingConfig:
    """The pool a `paged` cell of these rows (one prompt length) and `new` tokens reserves, as Transformers takes it."""
    pool = pool_for(get_strategy("paged"), len(rows), len(rows[0]), len(rows[0]) + new - 1)
    return ContinuousBatchingConfig(
        page_size=pool.page_size,
        num_blocks=pool.blocks,
        max_batch_tokens=pool.max_batch_tokens,
        allow_block_sharing=False,
        max_memory_percent=1.0,
        auto_switch_to_flash=False,
    )


def greedy(new: int) -> GenerationConfig:
    return GenerationConfig(do_sample=False, max_new_tokens=new, eos_token_id=-1)


def generate_batch_times(model: Any, rows: list[list[int]], new: int) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of one `generate_batch` call, from its outputs' own stamps: token k is when the last row
    had it, as a cell times its calls."""
    outputs = list(
        model.generate_batch(
            rows,
            generation_config=greedy(new),
            continuous_batching_config=cell_pool_config(rows, new),
            record_timestamps=True,
            progress_bar=False,
        ).values()
    )
    stamps = [max(o.timestamps[k] for o in outputs) for k in range(new)]
    started = min(o.created_time for o in outputs)
    return (stamps[0] - started) * 1e3, (stamps[-1] - stamps[0]) / (new - 1) * 1e3


def stepped_times(model: Any, rows: list[list[int]], new: int) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) of one batch through a manager stepped in this thread (no background thread), each step
    stamped here: every step of same-length rows makes one token for every row."""
    manager = model.init_continuous_batching(
        generation_config=greedy(new), continuous_batching_config=cell_pool_config(rows, new)
    )
    processor = manager.batch_processor = manager._create_batch_processor()
    stamps = []
    with torch.inference_mode():
        started = time.perf_counter()
        for i, row in enumerate(rows):
            manager.add_request(row, request_id=f"r{i}", max_new_tokens=new)
        while processor.prepare_next_batch():
            manager._generation_step()
            processor.update_batch()
            stamps.append(time.perf_counter())
    manager.stop()
    if len(stamps) != new:
        raise RuntimeError(f"the stepped loop took {len(stamps)} steps for {new} tokens a row")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return (stamps[0] - started) * 1e3, sum(gaps) / len(gaps) * 1e3
