"""The planner's decode traffic and quantized bytes, by hand, on tiny-llama's shape.

That the planner's KV bytes equal the real cache's, for every strategy and shape, is the table in
`test_planned_equals_measured.py`; the decode traffic here reads the same cells (`measured_cell`).
"""

import pytest

from kvsweep.caches import get_strategy
from kvsweep.grid import Cell
from kvsweep.models.resolve import classify, kv_shape, load_config

SHAPE = kv_shape(load_config(classify("tiny-llama")))
# (context, new tokens, batch, dtype): rows of the planned = measured table
SHAPES = [
    pytest.param((100, 32, 1, "bfloat16"), id="ctx100-bf16"),
    pytest.param((64, 32, 2, "bfloat16"), id="ctx64-batch2", marks=pytest.mark.slow),
    pytest.param((130, 140, 1, "float32"), id="ctx130-new140-fp32-quantized-flush", marks=pytest.mark.slow),
]
DENSE = ("dynamic", "static", "static@300")  # the caches whose decode traffic is written out by hand below


@pytest.fixture(scope="module", params=SHAPES)
def measured(request, measured_cell) -> dict[tuple, dict]:
    context, new, batch, dtype = request.param
    cells = [(Cell("tiny-llama", dtype, context, batch, new, cache, False), cache) for cache in DENSE]
    return {(cell, cache): measured_cell(cell) for cell, cache in cells}


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
        assert result["status"] == "ok", (cell, result["error"])
        element = 4 if cell.dtype == "float32" else 2
        parameters = 853_120 - SHAPE.vocab_size * SHAPE.hidden_size  # tiny-llama's count, minus the lookup table
        if cache == "dynamic":
            tokens = cell.context_length + cell.max_new_tokens / 2  # mean of context + j over j = 1 .. new-1
        else:
            tokens = max(cell.context_length + cell.max_new_tokens - 1, 300 if cache == "static@300" else 0)
        expected = parameters * element + per_token * tokens * cell.batch_size * element
        assert result["metrics"]["decode_bytes_per_token"] == pytest.approx(expected), (cell.label, cache)
