"""The forecast as the kernels run: a CPU's matmul rate per dtype, a quantized model's weights as its kernel moves
them (a dequantized copy where the backend makes one), a compiled decode step's host time. Hand arithmetic from
the presets' configs and the backends' sources, never what the code printed."""

from dataclasses import replace

import pytest

from kvsweep.config.compose import compose_config
from kvsweep.forecast.cell_forecast import ModelCost, forecast_cell, model_cost, weights_read
from kvsweep.forecast.device_rates import (
    CPU_COMPILED_LAYER_OVERHEAD_S,
    CPU_FLOP_FRACTION,
    CPU_LAYER_OVERHEAD_S,
    CpuProbes,
    cpu_rates,
    gpu_rates,
    probe_cpu,
)
from kvsweep.gpu_datasheet import gpu_by_key
from kvsweep.grid import Cell
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import classify
from kvsweep.plan.memory_fit import weights_bytes
from kvsweep.plan.sweep_plan import inputs_spec, protocol_of

# Llama 3.1 8B's quantized linears, from its config (hidden 4096, 32 heads of 128, 8 KV heads, MLP 14336, 32
# layers): q and o 4096x4096, k and v 4096x1024, gate, up and down 4096x14336; the embeddings and head are not.
LLAMA_8B_QUANTIZED = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)


def llama_8b(weights: str, dtype: str, kind: str) -> tuple[Cell, ModelCost]:
    facts = read_facts(classify("llama-3.1-8b"))
    cell = Cell("llama-3.1-8b", dtype, 1024, 1, 32, "dynamic", False, weights=weights)
    return cell, model_cost(cell, facts.parameters, facts.layout, facts.shape, kind)


def protocol(device: str):
    cfg = compose_config([]).config
    return protocol_of(cfg.measure, device, inputs_spec(cfg))


def test_the_8b_quantized_linears_are_what_its_config_says():
    assert LLAMA_8B_QUANTIZED == 6_979_321_856


@pytest.mark.parametrize(
    ("weights", "dtype", "kind", "rows", "copied"),
    [
        # quanto int8 on CUDA: `output_scales * weights` writes a bf16 copy (2 B a weight) the matmul reads again
        ("quanto-int8", "bfloat16", "cuda", 1, True),
        # ... on a CPU in bfloat16, `_weight_int8pack_mm` reads the int8 weights themselves
        ("quanto-int8", "bfloat16", "cpu", 1, False),
        ("quanto-int8", "float16", "cpu", 1, True),
        # quanto int4: tinygemm (bf16) and AWQ (fp16, CUDA) read the packed weights; float32 dequantizes first
        ("quanto-int4", "bfloat16", "cuda", 1, False),
        ("quanto-int4", "float16", "cuda", 1, False),
        ("quanto-int4", "float32", "cpu", 1, True),
        # bitsandbytes NF4: one row is gemv_4bit on the packed weights; two rows dequantize first
        ("bnb-nf4", "bfloat16", "cuda", 1, False),
        ("bnb-nf4", "bfloat16", "cuda", 2, True),
        ("bnb-int8", "bfloat16", "cuda", 4, False),
        ("torchao-int4", "bfloat16", "cuda", 4, False),
        ("none", "bfloat16", "cuda", 4, False),
    ],
)
def test_a_quantized_model_moves_its_stored_bytes_plus_the_copy_its_kernel_writes_and_reads(
    weights, dtype, kind, rows, copied
):
    """The kernel's bytes a pass: the stored ones (the layout's exact bytes), plus, where the backend first writes
    the weights out in the dtype, that copy written once and read once: 2 × dtype bytes × the quantized weights."""
    cell, model = llama_8b(weights, dtype, kind)
    facts = read_facts(classify("llama-3.1-8b"))
    stored = weights_bytes(cell, facts.parameters, facts.layout)
    copy = 2 * {"bfloat16": 2, "float16": 2, "float32": 4}[dtype] * LLAMA_8B_QUANTIZED
    assert weights_read(model, rows) == stored + (copy if copied else 0)


def test_quanto_int8_on_an_h100_decodes_at_its_kernels_bytes_not_its_stored_ones():
    """Llama 3.1 8B, quanto int8, bf16, one row on an H100 SXM (3,350 GB/s at 0.8): its step reads ~8 GB stored
    and moves 4 × 6.98e9 = 27.9 GB of bf16 copy, which takes more than 3x as long as the stored read."""
    cell, model = llama_8b("quanto-int8", "bfloat16", "cuda")
    rates = gpu_rates(gpu_by_key("h100-sxm"), 25.0)
    step = forecast_cell(cell, protocol("cuda"), model, rates).tpot_s
    stored_only = forecast_cell(cell, protocol("cuda"), replace(model, copy_bytes=0), rates).tpot_s
    assert step - stored_only == pytest.approx(4 * LLAMA_8B_QUANTIZED / (3350e9 * 0.8), rel=1e-9)
    assert step - stored_only > 3 * model.weight_bytes / (3350e9 * 0.8)


def test_a_cpu_prefill_runs_at_the_rate_its_probe_read_in_the_cells_dtype():
    """A CPU with no bfloat16 instructions: its probe reads 150 GFLOP/s in float32, 20 in bfloat16. The same long
    prefill then takes 7.5x longer in bfloat16 (its FLOPs at 20 × the calibrated share, not at 150 × it)."""
    rates = cpu_rates(CpuProbes({"float32": 150e9, "bfloat16": 20e9}, 30e9))
    assert rates.flop_rate_of("bfloat16") == pytest.approx(20e9 * CPU_FLOP_FRACTION)
    facts = read_facts(classify("smollm2-135m"))
    prefill = {}
    for dtype in ("float32", "bfloat16"):
        cell = Cell("smollm2-135m", dtype, 4096, 1, 8, "dynamic", False)
        model = model_cost(cell, facts.parameters, facts.layout, facts.shape, "cpu")
        prefill[dtype] = forecast_cell(cell, protocol("cpu"), model, rates).ttft_s - 30 * CPU_LAYER_OVERHEAD_S
    assert prefill["bfloat16"] / prefill["float32"] == pytest.approx(7.5, rel=1e-9)


def test_the_cpu_probes_read_every_dtype_the_grid_runs_and_float32_always():
    """Real probes on this machine: a reading per dtype asked for, float32 among them, each a plausible FLOP/s."""
    probes = probe_cpu(0, ["bfloat16"])
    assert set(probes.flop_rates) == {"float32", "bfloat16"}
    assert all(1e8 < rate < 1e14 for rate in probes.flop_rates.values()) and probes.bandwidth > 1e8


@pytest.mark.parametrize(
    ("rates", "eager", "compiled"),
    [
        (cpu_rates(CpuProbes({"float32": 150e9}, 30e9)), CPU_LAYER_OVERHEAD_S, CPU_COMPILED_LAYER_OVERHEAD_S),
        (gpu_rates(gpu_by_key("h100-sxm"), 25.0), 3e-4, 1e-5),
    ],
)
def test_a_compiled_static_cells_decode_step_spends_the_compiled_host_time_a_layer(rates, eager, compiled):
    """tiny-llama's 4 layers: compiling its static cell changes its step by 4 × (compiled − eager) a layer, and
    nothing else; a cache that cannot compile (offloaded) keeps the eager overhead."""
    facts = read_facts(classify("tiny-llama"))
    device = "cuda" if rates.gpu else "cpu"
    steps = {}
    for cache in ("static", "offloaded"):
        for compile_ in (False, True):
            cell = Cell("tiny-llama", "float32", 512, 1, 8, cache, compile_)
            model = model_cost(cell, facts.parameters, facts.layout, facts.shape, device)
            steps[cache, compile_] = forecast_cell(cell, protocol(device), model, rates).tpot_s
    assert steps["static", True] - steps["static", False] == pytest.approx(4 * (compiled - eager), rel=1e-9)
    assert steps["offloaded", True] == steps["offloaded", False]
