"""The capacity search's probes, checked against a known frontier (an oracle that fails above it).

No Ray: the search is a pure function of the results it is given; here each result is made by hand
from the oracle, so where the search ends can be compared with the frontier the oracle was built on.
"""

import math

import pytest

from kvsweep.capacity.frontier import (
    BATCH,
    CONTEXT,
    MAX_BATCH,
    MEMORY,
    SLO_TPOT,
    UNFINISHED,
    FrontierKey,
    SearchSettings,
    Slo,
    frontier_of,
    frontiers,
)
from kvsweep.capacity.search_steps import Stepping, aim, crossing
from kvsweep.config.compose import compose_config
from kvsweep.driver.capacity_search import plan_searches
from kvsweep.grid import MeasureProtocol, cell_id
from kvsweep.names import Metric, ResultTag, ci_high
from kvsweep.plan.sweep_plan import plan_limits
from kvsweep.results import OK, OOM, CellResult


def walk(ceiling: int, start: int, frontier: int) -> list[int]:
    """Every value the search probes when exactly the values up to `frontier` pass."""
    stepping, probed = Stepping(ceiling, start), []
    while (value := stepping.next_value()) is not None:
        assert value not in probed, f"probed {value} twice"
        probed.append(value)
        stepping.record(value, value <= frontier)
    assert stepping.best == frontier
    return probed


@pytest.mark.parametrize("ceiling", [1, 7, 64])
def test_the_search_ends_on_the_true_frontier_from_any_start(ceiling):
    for frontier in range(ceiling + 1):
        for start in range(1, ceiling + 1):
            walk(ceiling, start, frontier)  # asserts the frontier it ends on


def test_an_exact_prediction_costs_two_probes_and_one_at_the_ceiling():
    assert walk(256, 24, 24) == [24, 25]
    assert walk(256, 256, 256) == [256]
    assert walk(256, 24, 23) == [24, 23]  # one too many predicted: one step down


def test_without_a_prediction_the_search_doubles_then_bisects():
    assert walk(256, 1, 40) == [1, 2, 4, 8, 16, 32, 64, 48, 40, 44, 42, 41]


@pytest.mark.parametrize("error", [1, 3, 10, 50, 120])
def test_a_wrong_prediction_costs_about_two_log2_of_its_error(error):
    for frontier in (100 + error, max(100 - error, 0)):
        probes = walk(256, 100, frontier)
        assert len(probes) <= 2 * math.ceil(math.log2(error + 1)) + 2, (frontier, probes)


SETTINGS = SearchSettings(Slo(tpot_ms=10.0), max_batch=16, context_step=64, max_context=0)


def probe(key: FrontierKey, value: int, status: str = OK, tpot_high: float = 5.0, **metrics: float) -> CellResult:
    cell = key.cell(value)
    result = CellResult(f"id-{key.axis}-{value}", cell, status, tags={ResultTag.SEARCH: key.axis})
    if status == OK:
        result.metrics = {Metric.TPOT_MS: tpot_high - 1, ci_high(Metric.TPOT_MS): tpot_high, **metrics}
        result.metrics.setdefault(Metric.DECODE_TOKENS_PER_S, 100.0 * value)
    else:
        result.metrics = dict(metrics)
    return result


KEY = FrontierKey(BATCH, "tiny-llama", "float32", "dynamic", False, 32, "random", 256)


def test_a_frontier_is_rebuilt_from_its_probes_with_the_reason_it_stops():
    # Predicted 6: the search asked 6 (ok), 7 (over the SLO at the interval's upper end, not the median).
    probes = [
        probe(KEY, 6, tpot_high=9.5, **{Metric.PREDICTED_MAX_BATCH: 6}),
        probe(KEY, 7, tpot_high=10.5, **{Metric.PREDICTED_MAX_BATCH: 6}),
    ]
    found = frontier_of(KEY, SETTINGS, probes)
    assert (found.value, found.limit, found.predicted, found.probes) == (6, SLO_TPOT, 6, 2)
    assert found.goodput_tokens_per_s == 600.0 and found.at is probes[0] and found.limited_by is probes[1]


def test_memory_the_ceiling_and_an_interrupted_search_are_told_apart():
    oom = [probe(KEY, 1), probe(KEY, 2), probe(KEY, 4, status=OOM), probe(KEY, 3)]
    assert (frontier_of(KEY, SETTINGS, oom).value, frontier_of(KEY, SETTINGS, oom).limit) == (3, MEMORY)
    capped = [probe(KEY, v) for v in (1, 2, 4, 8, 16)]
    assert (frontier_of(KEY, SETTINGS, capped).value, frontier_of(KEY, SETTINGS, capped).limit) == (16, MAX_BATCH)
    cut = [probe(KEY, 1), probe(KEY, 2)]  # stopped before it found a failure
    assert frontier_of(KEY, SETTINGS, cut).limit == UNFINISHED


def test_a_context_frontier_counts_in_steps_of_the_context_step():
    key = FrontierKey(CONTEXT, "tiny-llama", "float32", "dynamic", False, 32, "random", 2)
    stamp = {Metric.SEARCH_MAX_CONTEXT: 1024, Metric.PREDICTED_MAX_CONTEXT: 512}
    probes = [probe(key, 512, **stamp), probe(key, 576, status=OOM, **stamp)]  # 512 = 8 steps, then 9 steps
    found = frontier_of(key, SETTINGS, probes)
    assert (found.value, found.limit, found.predicted) == (512, MEMORY, 512)
    assert [f.value for f in frontiers(probes, SETTINGS)] == [512]


def searches_for(*overrides: str):
    cfg = compose_config(["search.batch=true", "search.contexts=true", "search.max_batch=16", *overrides]).config
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
    searches, problems = plan_searches(cfg, "cpu", plan_limits(cfg, "cpu"), protocol, {})
    assert not problems
    return searches, protocol


def oracle(max_batch: int, max_context: int):
    """A result for any probe: OOM beyond batch x context of max_batch x 256 or past max_context."""

    def result_for(job) -> CellResult:
        cell = job.cell
        fits = cell.batch_size * cell.context_length <= max_batch * 256 and cell.context_length <= max_context
        status = OK if fits else OOM
        metrics = {Metric.TPOT_MS: 1.0, Metric.DECODE_TOKENS_PER_S: float(cell.batch_size)} if fits else {}
        return CellResult(job.cell_id, cell, status, metrics=metrics)

    return result_for


def run_searches(searches, result_for, done=None, stop_after: int | None = None) -> list[CellResult]:
    """Drive the searches as the scheduler does: run each job, record its result, queue its follow-ups."""
    ran: list[CellResult] = []
    recorded: list[CellResult] = []

    def record(result: CellResult) -> None:
        result.tags[ResultTag.SEARCH] = searches.tag_value(result.cell_id)
        result.metrics.update(searches.probe_metrics(result.cell_id))
        recorded.append(result)

    queue = searches.start(done or {}, record, recorded.append)
    while queue and (stop_after is None or len(ran) < stop_after):
        result = result_for(queue.pop(0))
        ran.append(result)
        record(result)
        queue += searches.follow_up(result)
    return ran, recorded


def test_searches_replay_a_resumed_run_without_measuring_a_probe_twice():
    # 'tiny-llama' on the CPU with no memory limit: nothing predicted, each search starts at its smallest size.
    args = (
        "grid.caches=[dynamic]",
        "grid.dtypes=[float32]",
        "grid.context_lengths=[256]",
        "grid.batch_sizes=[2]",
        "search.context_step=64",
        "search.max_context=1024",
    )
    whole, _ = searches_for(*args)
    ran, whole_results = run_searches(whole, oracle(max_batch=6, max_context=640))
    found = {(f.key.axis, f.value, f.limit) for f in frontiers(whole_results, SETTINGS_FOR_ORACLE)}
    assert found == {(BATCH, 6, MEMORY), (CONTEXT, 640, MEMORY)}  # 6 x 256; and 640 < 6 x 256 / 2
    assert len({r.cell_id for r in ran}) == len(ran)  # every probe measured once
    # Both searches ask for batch 2 at context 256: measured once, and a probe of each frontier.
    assert [(r.cell.batch_size, r.cell.context_length) for r in ran].count((2, 256)) == 1
    for found in frontiers(whole_results, SETTINGS_FOR_ORACLE):
        assert any((p.cell.batch_size, p.cell.context_length) == (2, 256) for p in found.results)

    cut, _ = searches_for(*args)
    first, _ = run_searches(cut, oracle(6, 640), stop_after=3)
    again, _ = searches_for(*args)
    done = {r.cell_id: r for r in first}
    rest, resumed_results = run_searches(again, oracle(6, 640), done=done)
    assert not {r.cell_id for r in rest} & set(done)  # nothing measured before is measured again
    assert sorted(r.cell_id for r in first + rest) == sorted(r.cell_id for r in ran)  # the same probes in all
    assert {(f.key.axis, f.value) for f in frontiers(resumed_results + rest, SETTINGS_FOR_ORACLE)} == {
        (BATCH, 6),
        (CONTEXT, 640),
    }


SETTINGS_FOR_ORACLE = SearchSettings(Slo(), max_batch=16, context_step=64, max_context=1024)


def test_probe_ids_are_the_cells_ids():
    searches, protocol = searches_for("grid.context_lengths=[256]")
    first = searches.first_probes()[0]
    assert cell_id(first.cell, protocol) in searches.planned


def test_a_line_through_the_readings_says_where_the_target_is_crossed():
    assert crossing({4: 40.0, 8: 80.0}, 100.0) == 10  # extrapolated: 10 bytes a row, 100 reached at 10
    assert crossing({4: 40.0, 12: 120.0}, 100.0) == 10  # between a pass and a failure (regula falsi)
    assert crossing({4: 40.0}, 100.0, slope_hint=20.0) == 7  # one reading and the planner's slope: 40 + 3 x 20
    assert crossing({4: 40.0}, 100.0) is None and crossing({4: 50.0, 8: 50.0}, 100.0) is None  # no rising line


def walk_with_readings(ceiling: int, start: int, fixed: float, per_row: float, budget: float, hint: float) -> list[int]:
    """A memory frontier with readings: peak = fixed + per_row x batch, OOM above `budget`."""
    key = FrontierKey(BATCH, "m", "float32", "dynamic", False, 8, "random", 256)
    stepping, results, probed = Stepping(ceiling, start), {}, []
    while (value := stepping.next_value()) is not None:
        probed.append(value)
        peak = fixed + per_row * value
        result = probe(key, value, status=OK if peak <= budget else OOM)
        if peak <= budget:
            result.metrics[Metric.PEAK_DEVICE_MEM_BYTES] = peak
        results[value] = result
        passed = peak <= budget
        stepping.record(value, passed, aim(results, Slo(), int(budget), lambda v: hint) if passed else None)
    assert stepping.best == int((budget - fixed) // per_row)
    return probed


def test_memory_readings_take_the_search_to_the_frontier_in_a_few_probes_whatever_the_prediction():
    # True frontier 97 (1 GB fixed, 80 MB a row, 8.8 GB budget); the planner predicted 40 and thinks 100 MB a row.
    # 40 passes at 4.2 GB: with the planner's slope the next guess is 40 + 4.6 GB / 100 MB = 86; 86's reading
    # gives the true slope, so 97; then 98 fails: found.
    assert walk_with_readings(256, 40, 1e9, 80e6, 8.8e9, hint=100e6) == [40, 86, 97, 98]
    assert len(walk(256, 40, 97)) == 12  # without readings: 40, 41, 43, 47, 55, 71, 103, then bisecting


def test_an_slo_reading_aims_between_a_pass_and_a_failure():
    key = FrontierKey(BATCH, "m", "float32", "dynamic", False, 8, "random", 256)
    probes = {10: probe(key, 10, tpot_high=30.0), 20: probe(key, 20, tpot_high=70.0)}  # 4 ms a row
    assert aim(probes, Slo(tpot_ms=50.0), None, lambda v: None) == 15  # 30 + 4 x 5 = 50


def test_the_dry_run_prints_each_predicted_frontier_the_largest_batch_the_planner_fits(capsys):
    from kvsweep.caches import get_strategy
    from kvsweep.driver.dry_run import dry_run
    from kvsweep.models.presets import PRESETS
    from kvsweep.models.shape import shape_from_dict
    from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES, estimate_peak

    cfg = compose_config(["+sweep=capacity", "grid.models=[llama-3.1-8b]", "planner.device_memory_gb=80"]).config
    assert dry_run(cfg) == 0
    out = capsys.readouterr().out
    assert "45 capacity searches" in out and "grid.batch_sizes [1] not used" in out
    # By hand: walk the batch up until the planner's peak for dynamic at 32k no longer fits 80 GB.
    preset = PRESETS["llama-3.1-8b"]
    shape, parameters, strategy = shape_from_dict(preset.config), preset.parameters(), get_strategy("dynamic")
    key = FrontierKey(BATCH, "llama-3.1-8b", "bfloat16", "dynamic", False, 128, "random", 32768)
    batch = 0
    while estimate_peak(key.cell(batch + 1), strategy, shape, parameters).peak_bytes + CUDA_CONTEXT_BYTES <= 80e9:
        batch += 1
    [line] = [x for x in out.splitlines() if x.strip().startswith("dynamic ctx32768 ") and "predicted" in x]
    assert f"predicted max batch {batch} (up to 256); first probe {batch}" in line


def test_a_memory_limit_is_the_gpu_the_planner_fits_grid_cells_to():
    from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES
    from kvsweep.plan.sweep_plan import plan_sweep

    args = ["+sweep=long_context", "planner.device_memory_gb=80", "measure.device_memory_limit_gb=24"]
    cfg = compose_config(args).config
    limits = plan_limits(cfg, "cuda")
    assert limits.device_bytes == 24 * 10**9 + CUDA_CONTEXT_BYTES  # torch's cap, the context on top
    planned, _ = plan_sweep(cfg, "cuda", limits)
    [cell] = [
        p for p in planned if p.cell.cache == "dynamic" and p.cell.context_length == 65536 and p.cell.batch_size == 4
    ]
    # 8B weights (16 GB) + 65,663 tokens x 4 rows x 128 KiB of bf16 K/V (34 GB): over 24 GB, under 80.
    assert cell.skip_reason is not None and cell.skip_reason.startswith("predicted oom")


def test_a_sweep_started_before_the_capacity_keys_resumes_under_the_same_key():
    import hashlib
    import json
    from dataclasses import asdict

    from kvsweep.driver.sweep_tracking import sweep_key

    cfg = compose_config([]).config
    whole = asdict(cfg)
    # The key as it was before search, slo and the memory limit existed (and before quality_trials); the
    # measurement revision (`test_sweep_identity.py`) is another matter.
    measure = {k: v for k, v in whole["measure"].items() if k not in ("quality_trials", "device_memory_limit_gb")}
    before = {k: whole[k] for k in ("name", "grid", "device", "trust_remote_code")}
    before |= {"measure": measure, "experiment": cfg.mlflow.experiment}
    assert sweep_key(cfg, 1) == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    changed = {
        sweep_key(compose_config([o]).config, 1) for o in ("measure.device_memory_limit_gb=24", "search.batch=true")
    }
    assert sweep_key(cfg, 1) not in changed and len(changed) == 2  # a search or a limit is another sweep
