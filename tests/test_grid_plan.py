"""Grid expansion and the plan's run/skip decisions."""

import pytest

from kvsweep.grid import Cell, MeasureProtocol, cell_id, expand_grid
from kvsweep.models.presets import PRESETS
from kvsweep.models.resolve import classify, kv_shape, load_config, meta_model
from kvsweep.plan.cell_plan import plan_cell

GRID = {
    "models": ["tiny-llama"],
    "dtypes": ["float32", "bfloat16"],
    "context_lengths": [256, 1024],
    "batch_sizes": [1, 4],
    "max_new_tokens": [16],
    "caches": ["dynamic", "static"],
    "compile": [False, True],
}
PROTO = MeasureProtocol.exact(warmup=1, repeats=3, seed=0, device="cpu", threads=1)


def tiny_shape():
    return kv_shape(load_config(classify("tiny-llama")))


def test_grid_is_the_cartesian_product_without_pointless_compile_twins():
    cells = expand_grid(GRID)
    # 2 dtypes x 2 contexts x 2 batches x (dynamic + static + static compiled)
    assert len(cells) == 2 * 2 * 2 * 3
    assert not any(c.compile and c.cache == "dynamic" for c in cells)
    assert len(set(cells)) == len(cells)


def test_the_grid_keeps_the_configs_order_and_the_sweep_queues_small_cells_first():
    from kvsweep.driver.job_sources import size_order
    from kvsweep.driver.scheduler import Job

    unsorted = {**GRID, "dtypes": ["float32"], "context_lengths": [1024, 256], "batch_sizes": [4, 1]}
    cells = [c for c in expand_grid(unsorted) if c.cache == "static" and not c.compile]
    assert [(c.batch_size, c.context_length) for c in cells] == [(4, 1024), (4, 256), (1, 1024), (1, 256)]
    # the order the sweep hands the scheduler: tokens held, batch x (context + 16 new): 272, 1040, 1088, 4160
    queued = [job.cell for job in sorted((Job(cell_id(c, PROTO), c) for c in cells), key=size_order)]
    assert [(c.batch_size, c.context_length) for c in queued] == [(1, 256), (1, 1024), (4, 256), (4, 1024)]


def test_cell_id_is_stable_and_depends_on_settings_and_protocol():
    cell = Cell("tiny-llama", "float32", 256, 1, 16, "dynamic", False)
    assert cell_id(cell, PROTO) == cell_id(Cell(**cell.to_dict()), PROTO)
    assert cell_id(cell, PROTO) != cell_id(Cell(**{**cell.to_dict(), "cache": "static"}), PROTO)
    assert cell_id(cell, PROTO) != cell_id(cell, MeasureProtocol.exact(1, 5, 0, "cpu", 1))


def test_plan_reasons():
    shape = tiny_shape()
    cell = Cell("tiny-llama", "float32", 256, 1, 16, "dynamic", False)
    assert plan_cell(cell, "cpu", shape).runs
    offloaded = plan_cell(Cell(**{**cell.to_dict(), "cache": "offloaded"}), "cpu", shape)
    assert "needs CUDA" in offloaded.skip_reason
    assert plan_cell(Cell(**{**cell.to_dict(), "cache": "offloaded"}), "cuda", shape).runs
    missing = plan_cell(
        Cell(**{**cell.to_dict(), "cache": "quantized-hqq-int4"}),
        "cpu",
        shape,
        is_installed=lambda module: module != "hqq",
    )
    assert "needs the 'hqq' package" in missing.skip_reason
    too_long = plan_cell(Cell(**{**cell.to_dict(), "context_length": 4090}), "cpu", shape)
    assert "needs 4106 positions; tiny-llama has 4096" in too_long.skip_reason
    reserve = plan_cell(Cell(**{**cell.to_dict(), "cache": "static@8192"}), "cpu", shape)
    assert "needs 8192 positions" in reserve.skip_reason


def test_plan_estimates_follow_the_formula():
    shape = tiny_shape()
    planned = plan_cell(Cell("tiny-llama", "bfloat16", 1000, 2, 25, "static@2048", False), "cpu", shape)
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2 * 2  # K+V, batch 2, 2 bytes
    assert planned.kv_dense_bytes == per_token * 1024
    assert planned.kv_stored_bytes == per_token * 2048


def test_presets_have_published_shapes():
    llama = kv_shape(load_config(classify("llama-3.1-8b")))
    assert (llama.layers, llama.kv_heads, llama.head_dim, llama.max_positions) == (32, 8, 128, 131072)
    qwen = kv_shape(load_config(classify("qwen2.5-7b")))
    assert (qwen.layers, qwen.kv_heads, qwen.head_dim) == (28, 4, 128)
    mistral = kv_shape(load_config(classify("mistral-7b")))
    assert (mistral.layers, mistral.kv_heads, mistral.head_dim, mistral.max_positions) == (32, 8, 128, 32768)
    smol = kv_shape(load_config(classify("smollm2-135m")))
    assert (smol.layers, smol.kv_heads, smol.head_dim) == (30, 3, 64)
    tl = kv_shape(load_config(classify("tinyllama-1.1b")))
    assert (tl.layers, tl.kv_heads, tl.head_dim, tl.max_positions) == (22, 4, 64, 2048)
    assert {"tiny-llama", "smollm2-135m", "tinyllama-1.1b", "qwen2.5-7b", "llama-3.1-8b", "mistral-7b"} <= set(PRESETS)


def test_model_references_are_classified(tmp_path):
    assert classify("smollm2-135m").kind == "preset"
    assert classify(str(tmp_path)).kind == "local"
    assert classify("org/some-model").kind == "hub"


def parameter_count(config) -> int:
    """Every parameter of the model the config describes, tied weights once (built on the meta device)."""
    return sum(p.numel() for p in meta_model(config).parameters())


@pytest.mark.parametrize(("model", "dtype"), [("tiny-llama", "float32"), ("smollm2-135m", "bfloat16")])
def test_predicted_weights_equal_the_built_models_parameter_bytes(model, dtype):
    from kvsweep.caches import get_strategy
    from kvsweep.models.build import build_model
    from kvsweep.plan.memory_fit import estimate_peak

    config = load_config(classify(model))
    built = build_model(classify(model), dtype, "cpu", seed=0)
    measured = sum(p.numel() * p.element_size() for p in built.parameters())
    cell = Cell(model, dtype, 128, 1, 8, "dynamic", False)
    estimate = estimate_peak(cell, get_strategy("dynamic"), kv_shape(config), parameter_count(config))
    assert estimate.weights_bytes == measured


def test_cells_predicted_not_to_fit_are_skipped_on_cuda():
    config = load_config(classify("llama-3.1-8b"))
    shape, params = kv_shape(config), parameter_count(config)
    small = Cell("llama-3.1-8b", "bfloat16", 4096, 1, 128, "dynamic", False)
    huge = Cell("llama-3.1-8b", "bfloat16", 130944, 4, 128, "dynamic", False)
    gpu = 80 * 10**9
    assert plan_cell(small, "cuda", shape, parameters=params, device_bytes=gpu).runs
    skipped = plan_cell(huge, "cuda", shape, parameters=params, device_bytes=gpu)
    assert skipped.skip_reason.startswith("predicted oom: needs") and "of 80.0 GB" in skipped.skip_reason
    assert plan_cell(huge, "cuda", shape, parameters=params, device_bytes=gpu, skip_predicted_oom=False).runs
    assert skipped.memory.weights_bytes == params * 2 and params == 8_030_261_248  # Llama-3.1-8B's published size
    quantized = plan_cell(
        Cell(**{**huge.to_dict(), "cache": "quantized-hqq-int2"}), "cuda", shape, parameters=params, device_bytes=gpu
    )
    assert quantized.memory.kv_device_bytes < skipped.memory.kv_device_bytes / 6


def test_planner_device_memory_gb_counts_gigabytes_as_its_name_says():
    from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES, MemoryEstimate, detect_device_bytes, fits

    assert detect_device_bytes("cuda", 80) == 80_000_000_000
    assert detect_device_bytes("cuda", 0.5) == 500_000_000
    # A cell needing 79.9e9 bytes at its peak, plus the 1 GiB kept for the CUDA context, is 81.0e9: it
    # does not fit an 80 GB card. Read as GiB, 80 was 85.9e9 bytes and the cell was predicted to fit.
    cell = MemoryEstimate(weights_bytes=70 * 10**9, kv_device_bytes=9 * 10**9, working_bytes=9 * 10**8)
    assert cell.peak_bytes == 79_900_000_000 and CUDA_CONTEXT_BYTES == 2**30
    assert not fits(cell, detect_device_bytes("cuda", 80))
    assert fits(cell, 80 * 2**30)  # the old reading
    assert fits(cell, detect_device_bytes("cuda", 81.1))


def test_the_plan_says_what_sizes_it_fits_cells_against_with_their_units():
    from kvsweep.config.compose import compose_config
    from kvsweep.plan.sweep_plan import plan_limits, plan_sweep, plan_text

    overrides = ["+sweep=long_context", "planner.device_memory_gb=80", "planner.host_memory_gb=512"]
    cfg = compose_config(overrides).config
    limits = plan_limits(cfg, "cuda")
    assert limits.device_bytes == 80 * 10**9 and limits.host.memory_bytes == 512 * 10**9
    planned, problems = plan_sweep(cfg, "cuda", limits)
    lines = plan_text(planned, problems, "cuda", limits).splitlines()
    assert lines[1] == "device memory 80.0 GB (planner.device_memory_gb)"
    assert lines[2].startswith("offloaded caches: host memory 512.0 GB (planner.host_memory_gb), host link 25 GB/s")
    unknown = plan_limits(compose_config(["+sweep=long_context"]).config, "cpu")
    assert unknown.device_bytes is None and "device memory" not in plan_text([], {}, "cpu", unknown)
