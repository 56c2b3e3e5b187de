"""`paged`: a batch through Transformers' continuous batching, its pool sized by kvsweep and read back.

Expectations are worked out here: the pool's bytes from Transformers' sector layout, pages from the tokens a row
caches, and the timing from a loop that drives a second manager step by step under this test's own clock.
"""

import pytest
import torch
from transformers import LogitsProcessorList

from kvsweep.caches import get_strategy
from kvsweep.grid import Cell
from kvsweep.models.build import build_model
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import classify
from kvsweep.names import Metric, ResultTag
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.memory_fit import estimate_peak
from kvsweep_testkit.paged import generate_batch_times

# tiny-llama: 4 layers, 2 KV heads of 32; one float32 token of every layer's K and V = 2 x 4 x 2 x 32 x 4 bytes
TOKEN_BYTES = 2048
PAGE = 256  # Transformers' default page size, which `paged` keeps
PAGE_BYTES = PAGE * TOKEN_BYTES  # 524,288: a multiple of 128, so a sector is one page


@pytest.mark.parametrize(
    ("cache", "context", "new", "batch", "pages_per_row"),
    [
        ("paged", 100, 8, 2, 1),  # 107 cached tokens a row: one page each
        ("paged", 300, 16, 2, 2),  # 315: two pages each
        ("paged@1000", 100, 8, 1, 4),  # a pool of 1,000 tokens a row, whatever the request: four pages
    ],
)
def test_the_pool_and_the_pages_in_use_are_counted_by_hand(cache, context, new, batch, pages_per_row, measured_cell):
    result = measured_cell(Cell("tiny-llama", "float32", context, batch, new, cache, False))
    assert result["status"] == "ok", result["error"]
    metrics, tags = result["metrics"], result["tags"]
    blocks = batch * pages_per_row
    # the pool as configured, and two trash sectors: never sized from the machine's free memory
    assert metrics[Metric.KV_CACHE_BYTES] == (blocks + 2) * PAGE_BYTES
    assert (
        f"blocks={blocks} " in tags[ResultTag.PAGED_POOL] and f"usable_blocks={blocks} " in tags[ResultTag.PAGED_POOL]
    )
    # pages in use at the fullest moment: each row's cached tokens (context + new - 1) in whole pages
    used_pages = batch * -(-(context + new - 1) // PAGE)
    assert metrics[Metric.KV_PAGES_PEAK] == used_pages
    assert metrics[Metric.KV_CACHE_IN_USE_BYTES] == used_pages * PAGE * TOKEN_BYTES
    assert metrics[Metric.KV_CACHE_BYTES_DENSE] == batch * (context + new - 1) * TOKEN_BYTES
    assert tags[ResultTag.CACHE_CLASS] == "PagedAttentionCache/FullAttentionCacheAllocator"
    assert "attention=sdpa" in tags[ResultTag.PAGED_POOL]


def test_paged_tokens_are_the_dynamic_caches(measured_cell):
    """Greedy tokens agree with dynamic's on the same inputs: the cell's own quality check, and the KL is said to
    be unmeasurable (continuous batching takes no logits processor), not left silently empty."""
    result = measured_cell(Cell("tiny-llama", "float32", 100, 2, 8, "paged", False))
    assert result["metrics"][Metric.TOKEN_AGREEMENT] == 1.0
    assert Metric.KL_DIVERGENCE not in result["metrics"]


def test_the_planner_fits_the_pool_and_its_mask():
    """The memory estimate holds the whole pool and the attention mask sdpa preallocates, [M, N + M] floats:
    M = 2 x 300 batch tokens, N = 4 pages x 256 readable tokens."""
    cell = Cell("tiny-llama", "float32", 300, 2, 16, "paged", False)
    shape = read_facts(classify("tiny-llama")).shape
    plan = plan_cell(cell, "cpu", shape)
    assert plan.kv_stored_bytes == (4 + 2) * PAGE_BYTES
    with_mask = estimate_peak(cell, get_strategy("paged"), shape, parameters=0)
    dynamic = estimate_peak(
        Cell("tiny-llama", "float32", 300, 2, 16, "dynamic", False), get_strategy("dynamic"), shape, parameters=0
    )
    mask = 600 * (4 * 256 + 600) * 4
    assert with_mask.peak_bytes - with_mask.kv_device_bytes - (dynamic.peak_bytes - dynamic.kv_device_bytes) == mask


@pytest.mark.slow
def test_the_cells_clock_agrees_with_transformers_generate_batch():
    """The session's TTFT and TPOT (its one manager serving every call) against `generate_batch` on the same
    prompts and pool, interleaved call for call. The bound catches what a wrong clock would add (a manager's
    0.55 s teardown or 0.1 s idle wait, a per-call warmup counted as a token), not this host's noise; the
    benchmark (scripts/benchmarks/paged_fidelity.py) gives the ratio."""
    from kvsweep.cell.paged_session import PagedSession

    cell = Cell("tiny-llama", "float32", 256, 2, 16, "paged", False)
    model = build_model(classify("tiny-llama"), "float32", "cpu", seed=0)
    inputs = torch.randint(0, model.config.vocab_size, (2, 256), generator=torch.Generator().manual_seed(0))
    session = PagedSession(model, inputs, cell, "cpu", None)
    strategy = get_strategy("paged")
    session.call(strategy)  # the manager starts, as a cell's cold call does
    generate_batch_times(model, inputs.tolist(), 16)
    cell_ttft, cell_tpot, reference_ttft, reference_tpot = [], [], [], []
    try:
        for _ in range(7):
            call = session.call(strategy)
            cell_ttft.append(call.times.ttft_ms)
            cell_tpot.append(call.times.tpot_ms)
            ttft, tpot = generate_batch_times(model, inputs.tolist(), 16)
            reference_ttft.append(ttft)
            reference_tpot.append(tpot)
    finally:
        session.close()
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    assert 0.5 < median(cell_ttft) / median(reference_ttft) < 2.0, (cell_ttft, reference_ttft)
    assert 0.6 < median(cell_tpot) / median(reference_tpot) < 1.6, (cell_tpot, reference_tpot)


def test_generate_beside_the_manager_runs_the_models_own_attention():
    """Continuous batching switches an eager model to `paged|eager` for as long as its manager lives; the dynamic
    baseline the quality check runs beside it must see the model's own attention, and the manager its own after."""
    from kvsweep.cell.paged_session import PagedSession

    cell = Cell("tiny-llama", "float32", 64, 1, 4, "paged", False)
    model = build_model(classify("tiny-llama"), "float32", "cpu", seed=0)
    model.set_attn_implementation("eager")
    inputs = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    session = PagedSession(model, inputs, cell, "cpu", None)
    try:
        session.call(get_strategy("paged"))
        assert model.config._attn_implementation == "paged|eager"  # what the manager runs
        with session.model_attention():
            assert model.config._attn_implementation == "eager"
        assert model.config._attn_implementation == "paged|eager"
        tokens = session.generate_with(get_strategy("dynamic"), LogitsProcessorList())
        assert tokens.shape == (1, 4)
        assert model.config._attn_implementation == "paged|eager"
    finally:
        session.close()
