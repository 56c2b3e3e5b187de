"""The forecast as a user meets it: each cell's terms worked out by hand, the sweep's bill, the budget's refusal,
the ETA and a resumed sweep's refinement; and every bundled sweep's dry run prints its bill."""

import io
import math
from contextlib import redirect_stderr, redirect_stdout

import pytest

from kvsweep.caches import get_strategy
from kvsweep.cli import main
from kvsweep.config.compose import compose_config
from kvsweep.driver.progress import SweepProgress
from kvsweep.driver.sweep_forecast import SweepForecast, forecast_summary, refined
from kvsweep.errors import ConfigError
from kvsweep.forecast import sustained
from kvsweep.forecast.cell_forecast import ModelCost, expected_measured, forecast_cell
from kvsweep.forecast.device_rates import DeviceRates
from kvsweep.forecast.sweep_bill import ForecastCell, SweepBill, packed_seconds
from kvsweep.grid import Cell
from kvsweep.models.facts import read_facts
from kvsweep.models.presets import PRESETS
from kvsweep.models.resolve import classify
from kvsweep.names import Metric
from kvsweep.plan.kv_prediction import decode_kv_traffic
from kvsweep.plan.sweep_plan import protocol_of
from kvsweep.results import CellResult

# Round rates so every term is a short division: 1 TFLOP/s, 100 GB/s, no host overhead, a 1 s start.
RATES = DeviceRates("test device", 1e12, 1e11, 1e10, 1e9, 0.0, 1.0, 10.0, calibrated=True)


def tiny_llama() -> ModelCost:
    parameters = PRESETS["tiny-llama"].parameters()
    shape = read_facts(classify("tiny-llama")).shape
    return ModelCost(parameters, parameters * 4, shape)  # float32: 4 bytes a weight


def kvsweep(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_a_cells_terms_are_the_prefill_flops_and_the_planners_decode_bytes_over_the_rates():
    """tiny-llama, 512 prompt tokens, 32 new, dynamic: the prefill is 2·P·N + 2·L·H·N² FLOPs at 1 TFLOP/s, a
    decode step the weights and the planner's cache bytes at 100 GB/s; the measured calls fill the 2 s floor."""
    model = tiny_llama()
    shape = model.shape
    cell = Cell("tiny-llama", "float32", 512, 1, 32, "dynamic", False)
    cfg = compose_config(["measure.warmup=1", "measure.repeats=5", "measure.min_duration_s=2"]).config
    protocol = protocol_of(cfg.measure, "cpu", _random_inputs(cfg))
    forecast = forecast_cell(cell, protocol, model, RATES)
    prefill = (2 * model.parameters * 512 + 2 * shape.layers * shape.hidden_size * 512**2) / 1e12
    kv = decode_kv_traffic(get_strategy("dynamic"), shape, 1, "float32", 512, 32).device_bytes
    step = (model.weight_bytes + kv) / 1e11
    call = prefill + 31 * step
    assert forecast.ttft_s == pytest.approx(prefill) and forecast.tpot_s == pytest.approx(step)
    assert forecast.term("cold call") == pytest.approx(call)
    assert forecast.term("warmup") == pytest.approx(call)
    calls = min(max(5, math.ceil(2 / call)), cfg.measure.repeat_cap)
    assert forecast.term("measured") == pytest.approx(calls * call)
    assert forecast.term("load") == pytest.approx(model.weight_bytes / 1e9)
    assert forecast.term("start") == 1.0 and forecast.term("quality") == 0.0  # dynamic on random ids: no checks
    assert forecast.seconds == pytest.approx(1.0 + model.weight_bytes / 1e9 + (2 + calls) * call)


@pytest.mark.parametrize(
    ("gpu", "fp32_tflops", "bf16_tflops"),
    [("h100-sxm", 67, 989.4), ("a100-80gb", 19.5, 312), ("l40s", 91.6, 362.05), ("l4", 30.3, 121)],
)
def test_a_float32_prefill_runs_at_the_cuda_core_peak_and_a_bf16_one_at_the_tensor_core_peak(
    gpu, fp32_tflops, bf16_tflops
):
    """PyTorch leaves TF32 off, so a float32 matmul runs on the CUDA cores: the datasheet's FP32 row (H100 SXM:
    67 TFLOP/s), not its dense bf16 tensor figure (989.4). The same cell's prefill in float32 and in bfloat16 is the
    same FLOPs at those two rates, each at the sustained share: their ratio is the datasheets' ratio."""
    from kvsweep.forecast.device_rates import gpu_rates
    from kvsweep.gpu_datasheet import gpu_by_key

    rates = gpu_rates(gpu_by_key(gpu), 25.0)
    model = tiny_llama()
    shape = model.shape
    cfg = compose_config([]).config
    protocol = protocol_of(cfg.measure, "cuda", _random_inputs(cfg))
    flops = 2 * model.parameters * 2048 + 2 * shape.layers * shape.hidden_size * 2048**2
    overhead = shape.layers * rates.layer_overhead_s
    for dtype, tflops in (("float32", fp32_tflops), ("bfloat16", bf16_tflops)):
        cell = Cell("tiny-llama", dtype, 2048, 1, 32, "dynamic", False)
        prefill = forecast_cell(cell, protocol, model, rates).ttft_s - overhead
        assert prefill == pytest.approx(flops / (tflops * 1e12 * sustained.GPU_FLOP_FRACTION), rel=1e-9), dtype
    assert "float32" in rates.label() and "TF32 off" in rates.label()


def _random_inputs(cfg):
    from kvsweep.plan.sweep_plan import inputs_spec

    return inputs_spec(cfg)


@pytest.mark.parametrize(
    ("call_s", "expected"),
    [
        (0.1, 20),  # 2 s floor / 0.1 s: 20 calls, above the 5 repeats
        (1.0, 5),  # the floor is met by the repeats
        (0.001, 30),  # 2,000 calls would fill the floor: the cap of 30
        (20.0, 5),  # slow calls: never fewer than the repeats, whatever the 60 s ceiling says
    ],
)
def test_measured_calls_follow_the_protocols_floor_cap_and_ceiling(call_s, expected):
    cfg = compose_config(
        ["measure.repeats=5", "measure.min_duration_s=2", "measure.max_repeats=30", "measure.max_duration_s=60"]
    ).config
    assert expected_measured(protocol_of(cfg.measure, "cpu", _random_inputs(cfg)), call_s) == expected


def test_the_bill_packs_cells_in_run_order_and_counts_gpus_busy_and_held():
    """Cells of 3, 3, 2, 2 and 2 h on 2 slots: 3|3, then 2 on each (5|5), then one more: 7 h. Busy GPU-hours: 12 h
    of cells on 2 GPUs each, plus a 720 GB download (1 h at 200 MB/s) the 4 GPUs wait through: 28. Held: the 4
    GPUs for the whole 8 h: 32, which the cost (2.5 a GPU-hour: 80) and a budget count."""
    assert packed_seconds([3, 3, 2, 2, 2], 2) == 7
    hours = [3, 3, 2, 2, 2]
    cells = [_forecast_cell(f"c{i}", h * 3600) for i, h in enumerate(hours)]
    bill = SweepBill(cells, RATES, gpus=4, gpus_per_cell=2, slots=2, gpu_hour_cost=2.5, download_bytes=720 * 10**9)
    assert bill.gpu_hours == pytest.approx(12 * 2 + 1 * 4)
    assert bill.wall_s == pytest.approx((1 + 7) * 3600)
    assert bill.held_gpu_hours == pytest.approx(4 * 8)
    first = bill.lines()[0]
    assert "28.00 GPU-hours busy, 32.00 held" in first and "80.00 at 2.5 a GPU-hour held" in first
    with pytest.raises(ConfigError, match=r"planner.max_gpu_hours=30: .* 32.00 GPU-hours held"):
        bill.check_budget(30)  # 28 busy would have passed it


def test_the_wall_time_follows_the_schedulers_order_smallest_first():
    """Four 1 h cells of 128 tokens and one 4 h cell of 4,096 on 2 slots: the sweep runs the small ones first
    (1|1, 2|2), then the large one: 6 h, where longest-first packing would have said 4 h."""
    small = [_forecast_cell(f"s{i}", 3600) for i in range(4)]
    large = _forecast_cell("large", 4 * 3600, context=4096)
    bill = SweepBill([large, *small], RATES, gpus=2, gpus_per_cell=1, slots=2)
    assert bill.wall_s == pytest.approx(6 * 3600)


def test_a_short_prompts_prefill_is_floored_by_reading_the_weights_once():
    """Llama 3.1 8B in bf16 on an H100 SXM, a 16-token prompt: its FLOPs take 2 × 8.03e9 × 16 / (989.4e12 × 0.6)
    = 0.43 ms, but the pass reads all 16 GB of weights at 3,350 GB/s × 0.8: 6.0 ms, the roofline's floor. At 4,096
    tokens the FLOPs take longer than the read, and the floor is gone."""
    from kvsweep.forecast.device_rates import gpu_rates
    from kvsweep.gpu_datasheet import gpu_by_key

    facts = read_facts(classify("llama-3.1-8b"))
    model = ModelCost(facts.parameters, 2 * facts.parameters, facts.shape)
    rates = gpu_rates(gpu_by_key("h100-sxm"), 25.0)
    cfg = compose_config([]).config
    protocol = protocol_of(cfg.measure, "cuda", _random_inputs(cfg))
    overhead = facts.shape.layers * rates.layer_overhead_s
    short = forecast_cell(Cell("llama-3.1-8b", "bfloat16", 16, 1, 8, "dynamic", False), protocol, model, rates)
    read = 2 * facts.parameters / (3350e9 * sustained.GPU_BANDWIDTH_FRACTION)
    assert short.ttft_s - overhead == pytest.approx(read) and read == pytest.approx(6.0e-3, rel=0.01)
    long = forecast_cell(Cell("llama-3.1-8b", "bfloat16", 4096, 1, 8, "dynamic", False), protocol, model, rates)
    assert long.ttft_s - overhead > 2 * facts.parameters * 4096 / (989.4e12 * sustained.GPU_FLOP_FRACTION) > read


def test_step_overhead_factors_measured_on_this_cpu_are_not_carried_to_an_uncalibrated_gpu():
    """Continuous batching's 2.3x step overhead was measured on this project's CPU: calibrated rates use it; rates
    no run has checked (a GPU's datasheet shares) give paged the dense per-layer overhead. The same paged cell on
    the same rates, calibrated or not, differs by (2.3 − 1) × layers × the per-layer overhead a step."""
    from dataclasses import replace

    model = tiny_llama()
    cfg = compose_config([]).config
    protocol = protocol_of(cfg.measure, "cpu", _random_inputs(cfg))
    measured = replace(RATES, layer_overhead_s=1e-3, calibrated=True)
    unchecked = replace(measured, calibrated=False)
    paged = Cell("tiny-llama", "float32", 512, 1, 8, "paged", False)

    def step(cell: Cell, rates: DeviceRates) -> float:
        return forecast_cell(cell, protocol, model, rates).tpot_s

    assert step(paged, measured) - step(paged, unchecked) == pytest.approx((2.3 - 1) * model.shape.layers * 1e-3)
    dense = Cell("tiny-llama", "float32", 512, 1, 8, "dynamic", False)
    assert step(dense, measured) == step(dense, unchecked)


def test_the_host_link_is_as_configured_but_never_above_what_the_parts_pcie_sustains():
    """`planner.host_link_gbps` is a sustained rate; 100 GB/s is more than any PCIe x16 link carries one way: an
    H100's Gen5 link (64 GB/s) at 0.8 is 51.2 GB/s, an A100's Gen4 (32 GB/s) 25.6; the default 25 stands on both."""
    from kvsweep.forecast.device_rates import gpu_rates
    from kvsweep.gpu_datasheet import gpu_by_key

    assert gpu_rates(gpu_by_key("h100-sxm"), 100.0).host_link == pytest.approx(51.2e9)
    assert gpu_rates(gpu_by_key("a100-80gb"), 100.0).host_link == pytest.approx(25.6e9)
    for key in ("h100-sxm", "a100-80gb"):
        assert gpu_rates(gpu_by_key(key), 25.0).host_link == 25e9


def test_cells_fit_node_by_node_and_the_bill_never_counts_on_more():
    """Two nodes of 3 GPUs, 2 GPUs a cell: a cell's GPUs are on one node, so 2 cells at once, not 6 // 2 = 3. The
    scheduler keeps a `ray.max_concurrent` set higher (an autoscaler may add nodes while cells wait); the bill
    packs onto the 2 that fit now."""
    from kvsweep.driver.scheduler import cells_that_fit, max_concurrent
    from kvsweep.driver.sweep_forecast import scheduler_slots

    assert cells_that_fit(6, 2, (3.0, 3.0)) == 2 and cells_that_fit(6, 2) == 3
    assert max_concurrent(0, "cuda", 6, 2, (3.0, 3.0)) == 2 and max_concurrent(6, "cuda", 6, 2, (3.0, 3.0)) == 6
    assert max_concurrent(0, "cpu", 0, 1, ()) == 1
    cfg = compose_config(["ray.gpus_per_cell=2", "ray.max_concurrent=6"]).config
    assert scheduler_slots(cfg, "cuda", 6, 2, (3.0, 3.0)) == 2


def test_a_budget_over_cells_with_no_forecast_is_refused_naming_them():
    cells = [_forecast_cell("c0", 3600)]
    bill = SweepBill(cells, RATES, gpus=1, gpus_per_cell=1, slots=1, unforecast=["awq cell: its size is not known"])
    with pytest.raises(ConfigError, match=r"cannot hold 1 cells with no forecast \(awq cell: its size is not known\)"):
        bill.check_budget(1000)
    bill.check_budget(0)  # no budget: the bill only lists them


def _forecast_cell(cid: str, seconds: float, context: int = 128) -> ForecastCell:
    from kvsweep.forecast.cell_forecast import CellForecast
    from kvsweep.forecast.terms import Forecast, Term

    cell = Cell("tiny-llama", "float32", context, 1, 8, "dynamic", False)
    return ForecastCell(cid, cell, CellForecast(Forecast((Term("measured", seconds),)), 0.01, 0.001))


def test_a_sweep_over_its_budget_is_refused_in_one_line_before_anything_starts(tmp_path):
    code, out, err = kvsweep(
        "+sweep=long_context",
        "dry_run=true",
        "planner.gpu=h100-sxm",
        "planner.gpus=8",
        "planner.max_gpu_hours=0.5",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "planner.max_gpu_hours=0.5" in err and "GPU-hours" in err
    assert "forecast:" in out  # the dry run showed the bill it refused


def test_a_cpu_sweep_over_its_budget_never_starts_a_cell(ray_cluster, tmp_path):
    """On a CPU the budget counts the sweep's hours; refused before MLflow or any cell."""
    code, _, err = kvsweep(
        "planner.max_gpu_hours=0.0001",
        f"hydra.run.dir={tmp_path}/run",
        f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db",
    )
    assert code == 2 and "planner.max_gpu_hours" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("sweep", ["quickstart", "long_context", "capacity", "static_reserve", "traffic", "gpu_smoke"])
def test_every_bundled_sweep_dry_run_prints_its_bill(sweep, tmp_path):
    code, out, err = kvsweep(
        f"+sweep={sweep}", "dry_run=true", "planner.gpu=h100-sxm", "planner.gpus=8", f"hydra.run.dir={tmp_path}/run"
    )
    assert code == 0, err
    bill = next(line for line in out.splitlines() if line.startswith("forecast:"))
    assert "forecast: none" not in bill
    assert ("GPU-hours" in bill) == ("this CPU" not in bill)


def test_the_eta_is_the_remaining_forecast_scaled_by_what_finished_cells_took():
    progress = SweepProgress(3, 3, io.StringIO(), live=False)
    progress.forecast({"a": 10.0, "b": 20.0, "c": 30.0}, slots=2)
    assert progress.eta() == "0:00:30"  # 60 s of cells on 2 slots, before anything ran
    done = CellResult("a", Cell("tiny-llama", "float32", 128, 1, 8, "dynamic", False), "ok", wall_s=20.0)
    progress.finished(done)  # took twice its forecast
    assert progress.eta() == "0:01:00"  # (20 + 30) x 2 on 2 slots is 50 s, but c alone takes 30 x 2
    failed = CellResult("b", done.cell, "oom", wall_s=1.0)
    progress.finished(failed)  # an early failure says nothing about the forecast: the ratio stays 2
    assert progress.eta() == "0:01:00"


def test_a_resumed_sweep_scales_each_models_remaining_cells_by_its_finished_ones():
    cells = [_forecast_cell(cid, 10.0) for cid in ("a", "b", "c")]
    forecast = SweepForecast(SweepBill(cells, RATES, 0, 0, 1), {c.cell_id: c.forecast for c in cells})
    finished = [CellResult("a", cells[0].cell, "ok", wall_s=30.0)]  # 3x its forecast
    again, line = refined(forecast, finished)
    assert [c.cell_id for c in again.bill.cells] == ["b", "c"]
    assert again.by_id["b"].seconds == pytest.approx(30.0) and "took 3x" in line


def test_the_runs_closing_line_gives_the_median_ratio_and_the_totals():
    cell = Cell("tiny-llama", "float32", 128, 1, 8, "dynamic", False)
    results = [
        CellResult(cid, cell, "ok", wall_s=w, metrics={Metric.FORECAST_S: f, Metric.FORECAST_RATIO: w / f})
        for cid, w, f in (("a", 10.0, 5.0), ("b", 30.0, 10.0), ("c", 8.0, 8.0))
    ]
    line = forecast_summary(results)
    assert "cells took 2x their forecast (median of 3; 2.1x in total)" in line  # ratios 2, 3, 1; 48 / 23 = 2.09


def test_a_measured_compile_replaces_the_allowance_for_the_models_remaining_compiled_cells():
    """A finished compiled cell: a cold call of 12 s against a measured call of 100 ms + 7 x 10 ms: 11.83 s of
    compiling, which replaces the 60 s allowance of the remaining compiled cell of the model."""
    from kvsweep.forecast.cell_forecast import CellForecast
    from kvsweep.forecast.terms import Forecast, Term

    compiled = Cell("tiny-llama", "float32", 128, 1, 8, "static", True)
    waiting = CellForecast(Forecast((Term("compile", 60.0), Term("measured", 5.0))), 0.1, 0.01)
    forecast = SweepForecast(SweepBill([ForecastCell("b", compiled, waiting)], RATES, 0, 0, 1), {"b": waiting})
    metrics = {Metric.FIRST_CALL_MS: 12000.0, Metric.TTFT_MS: 100.0, Metric.TPOT_MS: 10.0}
    finished = [CellResult("a", compiled, "ok", wall_s=20.0, metrics=metrics)]  # no forecast of its own here
    again, line = refined(forecast, finished)
    assert again.by_id["b"].term("compile") == pytest.approx(11.83) and again.by_id["b"].seconds == pytest.approx(16.83)
    assert "compile measured 12 s" in line
