"""The planner's KV bytes are what Transformers' real caches hold: one table, every strategy on every layer kind.

A row is a cell run for real by `run_cell` (each cell once in a session: `measured_cell`). Its `kv_cache_bytes`,
`kv_cache_device_bytes` and `kv_cache_host_bytes` are read from the tensors of the cache `generate` returned
(`measure/cache_identity.py`); the planner's figures for the same cell come from the model's shape alone, before
anything runs. They must be equal, byte for byte.

The strategies are the registry's (`cache_names()`: a strategy registered tomorrow is a row tomorrow), with a
`static@N` reserve past the request and quantized settings (`@r..,g..,ak..,av..`) that flush the residual; the
layer kinds are a full-attention preset and every tiny model of `kvsweep_testkit.layer_kinds` (sliding window,
alternating sliding and full, chunked, state layers). A combination Transformers refuses is a row of its own
(`REFUSED`), asserted refused; one that needs CUDA runs on a GPU and is skipped, saying so, elsewhere.
"""

import functools

import pytest
import torch

from kvsweep.caches import cache_names, get_strategy
from kvsweep.grid import Cell
from kvsweep.models.build import build_model
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import classify
from kvsweep.models.shape import KvShape
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.memory_fit import estimate_peak
from kvsweep.plan.sweep_plan import predicted_metrics
from kvsweep_testkit.layer_kinds import TINY_LAYER_KINDS

FULL = "tiny-llama"  # 4 full-attention layers, 2 KV heads of 32: a bundled preset
KINDS = [FULL, *sorted(TINY_LAYER_KINDS)]
STRATEGIES = cache_names()  # read when the table is collected
QUANTIZED = [name for name in STRATEGIES if get_strategy(name).backend is not None]

# Combinations Transformers refuses, each asserted refused (by Transformers' own `generate`, by the planner and by
# the cell), never dropped from the table: its QuantizedCache raises "only full attention layers" on a model with
# any sliding-window, chunked or state layer, so every quantized strategy on each of these kinds. A new layer kind
# not listed here gets measured rows, and fails there if Transformers refuses it.
NOT_ALL_FULL_ATTENTION = [
    "tiny-gemma3-alternating",  # sliding and full layers
    "tiny-gpt-oss-alternating",  # sliding and full layers
    "tiny-lfm2-hybrid",  # short-convolution state layers and full ones
    "tiny-llama4-chunked",  # chunked and full layers
    "tiny-mistral-sliding",  # sliding layers only
]
REFUSED = [(kind, cache) for kind in NOT_ALL_FULL_ATTENTION for cache in QUANTIZED]
# Continuous batching refuses the state and chunked kinds itself (Transformers accepts full and sliding layers only);
# for the sliding kinds it runs, kvsweep's pool accounts full-attention pages only: a paged cell of any of these is
# planned skipped and skipped by the cell, saying why.
UNACCOUNTED = [(kind, "paged") for kind in NOT_ALL_FULL_ATTENTION]

FAST, SLOW = (), (pytest.mark.slow,)
# (id, (context, new tokens, batch, dtype), marks). Full attention: contexts not multiples of 128 and a decode past
# 128 tokens (a quantized flush) are where a residual-window guess goes wrong.
FULL_SHAPES = [
    ("ctx100-bf16", (100, 32, 1, "bfloat16"), FAST),
    ("ctx64-batch2", (64, 32, 2, "bfloat16"), SLOW),
    ("ctx130-new140-fp32-quantized-flush", (130, 140, 1, "float32"), SLOW),
]
# The tiny layer kinds (window 16): the prompt already past the window; the window crossed while decoding; batch 2
# in bf16; no decode step at all.
WINDOWED_SHAPES = [
    ("ctx30-new8", (30, 8, 1, "float32"), FAST),
    ("ctx10-new12", (10, 12, 1, "float32"), FAST),
    ("ctx40-new20-batch2-bf16", (40, 20, 2, "bfloat16"), SLOW),
    ("ctx24-new1", (24, 1, 1, "float32"), SLOW),
]
RESERVED = {FULL: "static@300"}  # a static@N reserving past every request; the tiny kinds reserve 40
# Quantized settings on full attention, each on its own shape. r16 with 40 new tokens flushes the residual twice.
QUANTIZED_SETTINGS = [
    ("quantized-hqq-int4@r16,g32", (100, 40, 1, "bfloat16"), FAST),
    ("quantized-hqq-int4@ak1,av1,r16", (64, 40, 1, "bfloat16"), FAST),
    ("quantized-hqq-int3@r16", (100, 40, 1, "bfloat16"), FAST),
    ("quantized-hqq-int1@g32,r16", (100, 40, 1, "bfloat16"), FAST),
    ("quantized-quanto-int2@r16,g32", (100, 40, 1, "bfloat16"), FAST),
    ("quantized-quanto-int4@ak-1,av-1,g16,r16", (64, 40, 1, "bfloat16"), FAST),
    ("quantized-hqq-int1@ak1,av1", (128, 140, 1, "float32"), SLOW),  # the default residual, flushed at step 128
    ("quantized-hqq-int3@g16,r64", (130, 140, 2, "float32"), SLOW),
    ("quantized-hqq-int2@ak1,g128,r32", (64, 70, 2, "bfloat16"), SLOW),
    ("quantized-hqq-int8@ak1,av1,r8", (33, 30, 1, "bfloat16"), SLOW),
    ("quantized-quanto-int2@av-1,g32,r48", (128, 100, 1, "float32"), SLOW),
    ("quantized-quanto-int4@g32,r1", (100, 10, 2, "bfloat16"), SLOW),
]
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: measured on a GPU run")


def _row(kind: str, cache: str, shape_id: str, shape: tuple, marks: tuple):
    cuda_only = (NO_CUDA,) if get_strategy(cache).requires.cuda else ()
    return pytest.param(kind, cache, shape, id=f"{kind}-{cache}-{shape_id}", marks=(*marks, *cuda_only))


def _rows() -> list:
    rows = []
    for kind in KINDS:
        shapes = FULL_SHAPES if kind == FULL else WINDOWED_SHAPES
        caches = [*STRATEGIES, RESERVED.get(kind, "static@40")]
        for cache in (c for c in caches if (kind, c) not in REFUSED and (kind, c) not in UNACCOUNTED):
            for i, (shape_id, shape, marks) in enumerate(shapes):
                # no_cache re-runs the prefill for every token: on full attention its first shape is enough
                if not (kind == FULL and cache == "no_cache" and i > 0):
                    rows.append(_row(kind, cache, shape_id, shape, marks))
    rows.append(_row(FULL, "paged@600", "ctx100-bf16-pool600", (100, 32, 1, "bfloat16"), FAST))  # 3 pages a row
    for cache, shape, marks in QUANTIZED_SETTINGS:
        context, new, batch, dtype = shape
        rows.append(_row(FULL, cache, f"ctx{context}-new{new}-b{batch}-{dtype}", shape, marks))
    return rows


ROWS = _rows()


@pytest.fixture(scope="module")
def model_of(layer_kind_folders):
    """A layer kind's model as a cell names it: the preset's name, or the tiny model's folder."""
    return lambda kind: kind if kind == FULL else str(layer_kind_folders[kind])


@functools.cache
def _shape(model: str) -> KvShape:
    shape = read_facts(classify(model)).shape
    assert shape is not None, model
    return shape


@pytest.mark.parametrize(("kind", "cache", "shape"), ROWS)
def test_planned_kv_bytes_are_the_real_caches(kind, cache, shape, model_of, measured_cell):
    """All, on the device and on the host: `kv_cache_bytes` is the planned `kv_stored_bytes`, and
    `kv_cache_device_bytes` the `predicted_kv_device_bytes` (an offloaded cache: the layers it keeps there and the
    one moved layer there when `generate` returns); a cache the planner keeps whole on the device is its peak."""
    context, new, batch, dtype = shape
    strategy = get_strategy(cache)
    device = "cuda" if strategy.requires.cuda else "cpu"
    cell = Cell(model_of(kind), dtype, context, batch, new, cache, False)
    result = measured_cell(cell, device)
    assert result["status"] == "ok", result["error"]
    planned = plan_cell(cell, device, _shape(cell.model))
    assert planned.runs, planned.skip_reason
    on_device = predicted_metrics(planned)["predicted_kv_device_bytes"]
    predicted = [planned.kv_stored_bytes, on_device, planned.kv_stored_bytes - on_device]
    measured = [result["metrics"][f"kv_cache{part}bytes"] for part in ("_", "_device_", "_host_")]
    assert measured == predicted, (cell.label, measured, predicted)
    if not strategy.offloading:  # the memory the planner fits the device with: the whole cache
        assert estimate_peak(cell, strategy, _shape(cell.model), parameters=0).kv_device_bytes == measured[0]


@pytest.fixture(scope="module")
def built(model_of):
    """Each layer kind's model, built once (float32, on the CPU) for Transformers' own `generate`."""
    return functools.cache(lambda kind: build_model(classify(model_of(kind)), "float32", "cpu", seed=0))


@pytest.mark.parametrize(("kind", "cache"), REFUSED, ids=[f"{kind}-{cache}" for kind, cache in REFUSED])
def test_what_transformers_refuses_is_refused_before_it_runs(kind, cache, model_of, built, measured_cell):
    """Transformers' `generate` raises; the planner plans the cell as skipped and the cell skips it, saying why."""
    options = get_strategy(cache).generation_options()
    with pytest.raises(ValueError, match="only full attention layers"), torch.inference_mode():
        built(kind).generate(torch.zeros(1, 30, dtype=torch.long), max_new_tokens=8, do_sample=False, **options)
    cell = Cell(model_of(kind), "float32", 30, 1, 8, cache, False)
    planned = plan_cell(cell, "cpu", _shape(cell.model))
    assert not planned.runs and "holds only full-attention layers" in (planned.skip_reason or "")
    result = measured_cell(cell)
    assert result["status"] == "skipped" and "holds only full-attention layers" in result["error"]


@pytest.mark.parametrize(("kind", "cache"), UNACCOUNTED, ids=[f"{kind}-{cache}" for kind, cache in UNACCOUNTED])
def test_a_pool_kvsweep_cannot_account_is_skipped_saying_so(kind, cache, model_of, measured_cell):
    cell = Cell(model_of(kind), "float32", 30, 1, 8, cache, False)
    planned = plan_cell(cell, "cpu", _shape(cell.model))
    assert not planned.runs and "page pool for full-attention layers only" in (planned.skip_reason or "")
    result = measured_cell(cell)
    assert result["status"] == "skipped" and "page pool for full-attention layers only" in result["error"]


def test_the_table_holds_every_strategy_on_every_layer_kind():
    """Every registered strategy meets every layer kind: in a measured row, or refused as `REFUSED` lists."""
    measured = {(row.values[0], get_strategy(row.values[1]).base_name) for row in ROWS}
    not_run = set(REFUSED) | set(UNACCOUNTED)
    assert measured | not_run == {(kind, cache) for kind in KINDS for cache in STRATEGIES}
    assert not measured & not_run
    fast = {
        (row.values[0], get_strategy(row.values[1]).base_name)
        for row in ROWS
        if all(m.name != "slow" for m in row.marks)
    }
    assert fast == measured  # the fast tier already meets each pair
