"""The planner predicts what is measured: KV bytes from shapes equal the bytes of the real cache.

Contexts that are not multiples of 128 and decodes longer than 128 tokens (a quantized flush) are
where a residual-window guess goes wrong; every CPU strategy is run for real on each shape.
"""

import pytest

from kvsweep.caches import cache_names, get_strategy
from kvsweep.cell.run_cell import run_cell
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.resolve import classify, kv_shape, load_config
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.memory_fit import estimate_peak

PROTO = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1).to_dict()
SHAPE = kv_shape(load_config(classify("tiny-llama")))
CPU_CACHES = [n for n in cache_names() if not get_strategy(n).requires.cuda] + ["static@300"]
# (context, new tokens, batch, dtype); the fast tier runs every strategy on the first shape.
FAST_SHAPE = (100, 32, 1, "bfloat16")
SHAPES = [
    pytest.param(FAST_SHAPE, id="ctx100-bf16"),
    pytest.param((64, 32, 2, "bfloat16"), id="ctx64-batch2", marks=pytest.mark.slow),
    pytest.param((130, 140, 1, "float32"), id="ctx130-new140-fp32-quantized-flush", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=SHAPES)
def measured(request) -> dict[tuple, dict]:
    context, new, batch, dtype = request.param
    # no_cache holds nothing on any shape (the first shape checks it); it would re-run the prefill per token
    caches = CPU_CACHES if request.param == FAST_SHAPE else [c for c in CPU_CACHES if c != "no_cache"]
    cells = [(Cell("tiny-llama", dtype, context, batch, new, cache, False), cache) for cache in caches]
    return {(cell, cache): run_cell(cell.to_dict(), PROTO) for cell, cache in cells}


def test_planner_kv_bytes_equal_the_measured_cache_for_every_strategy_and_shape(measured):
    wrong = {}
    for (cell, cache), result in measured.items():
        assert result["status"] == "ok", (cell, result["error"])
        got = result["metrics"]["kv_cache_bytes"]
        planned = plan_cell(cell, "cpu", SHAPE)
        device = estimate_peak(cell, get_strategy(cache), SHAPE, parameters=0).kv_device_bytes
        if not got == planned.kv_stored_bytes == device:
            wrong[cell.label] = (got, planned.kv_stored_bytes, device)
    assert not wrong, wrong


def test_quantized_bytes_measured_by_hand_in_the_issue():
    """quanto int4, bf16: 60,544 B (context 100/new 32), 100,352 (64/32, batch 2), 167,168 (200/200)."""
    quanto = get_strategy("quantized-quanto-int4")
    assert quanto.held_bytes(SHAPE, 1, "bfloat16", prompt=100, decoded=31) == 60_544
    assert quanto.held_bytes(SHAPE, 2, "bfloat16", prompt=64, decoded=31) == 100_352
    assert quanto.held_bytes(SHAPE, 1, "bfloat16", prompt=200, decoded=199) == 167_168


def test_decode_bytes_per_token_are_weights_and_the_cache_at_the_mean_decode_length(measured):
    """Untied tiny-llama: every parameter but the input embedding; the cache grows one token a step."""
    per_token = 2 * SHAPE.layers * SHAPE.kv_heads * SHAPE.head_dim  # K and V elements per cached token
    for (cell, cache), result in measured.items():
        if cache not in ("dynamic", "static", "static@300"):
            continue
        element = 4 if cell.dtype == "float32" else 2
        parameters = 853_120 - SHAPE.vocab_size * SHAPE.hidden_size  # tiny-llama's count, minus the lookup table
        if cache == "dynamic":
            tokens = cell.context_length + cell.max_new_tokens / 2  # mean of context + j over j = 1 .. new-1
        else:
            tokens = max(cell.context_length + cell.max_new_tokens - 1, 300 if cache == "static@300" else 0)
        expected = parameters * element + per_token * tokens * cell.batch_size * element
        assert result["metrics"]["decode_bytes_per_token"] == pytest.approx(expected), (cell.label, cache)
