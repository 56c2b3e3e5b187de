"""`compare`'s verdicts, thresholds and matching, by hand on results built with known numbers.

The sweeps themselves and the command line are in test_compare_cli.py (slow); here every expected
verdict and ratio is worked out from the numbers in the test.
"""

import math

import pytest

from kvsweep.compare.comparison import CELL_METRIC, STATUS_METRIC, SweepSide, compare_sweeps
from kvsweep.compare.judging import BY_NAME, Thresholds, drift_thresholds, interval, judge
from kvsweep.compare.tables import header_lines, ordered
from kvsweep.errors import ConfigError
from kvsweep.grid import Cell
from kvsweep.names import Metric, ResultTag, ci_high, ci_low
from kvsweep.results import OK, OOM, CellResult
from kvsweep.testing.faults import fault_for
from kvsweep.testing.testing_config import seams_from

TPOT = BY_NAME[Metric.TPOT_MS]


def cell(cache: str = "dynamic", context: int = 64, batch: int = 1) -> Cell:
    return Cell("tiny-llama", "float32", context, batch, 8, cache, False)


def result(c: Cell, tpot: tuple[float, float, float] = (2.0, 1.9, 2.1), status: str = OK, **extra) -> CellResult:
    """A cell's result with TPOT (median, low, high) and whatever other metrics `extra` gives."""
    median, low, high = tpot
    metrics = {Metric.TPOT_MS: median, ci_low(Metric.TPOT_MS): low, ci_high(Metric.TPOT_MS): high}
    tags = {ResultTag.CONTENDED: "true"} if extra.pop("contended", False) else {}
    environment = extra.pop("environment", {})
    metrics.update(extra)
    return CellResult("id", c, status, metrics=metrics if status == OK else {}, tags=tags, environment=environment)


def side(*results: CellResult, params: dict | None = None) -> SweepSide:
    return SweepSide("a" * 32, "s", list(results), params or {})


def verdicts(comparison, metric: str = Metric.TPOT_MS) -> dict[Cell, str]:
    return {r.cell: r.verdict for r in comparison.rows if r.metric == metric}


def test_a_change_is_called_only_when_the_intervals_are_apart_and_beyond_the_threshold():
    t = 0.10
    # apart (2.1 < 2.4) and 2.5/2.0 = 1.25 > 1.10: slower
    assert judge(TPOT, (1.9, 2.1), (2.4, 2.6), (2.0, 2.5), t, False).verdict == "slower"
    # apart, but 2.1/2.0 = 1.05 is inside the threshold: within noise
    assert judge(TPOT, (1.99, 2.01), (2.09, 2.11), (2.0, 2.1), t, False).verdict == "within noise"
    # 3.0/2.0 = 1.5, but the intervals overlap (2.9 > 2.8): within noise
    assert judge(TPOT, (1.2, 2.9), (2.8, 3.2), (2.0, 3.0), t, False).verdict == "within noise"
    # the other way: 1.6/2.0 = 0.8, A/B = 1.25 > 1.10 and apart: faster
    assert judge(TPOT, (1.9, 2.1), (1.5, 1.7), (2.0, 1.6), t, False).verdict == "faster"
    # a contended side: no verdict, however large the change
    assert judge(TPOT, (1.9, 2.1), (9.0, 11.0), (2.0, 10.0), t, True).verdict == "contended"


def test_the_ratios_range_is_the_farthest_each_side_may_sit_in_its_interval():
    judged = judge(TPOT, (1.9, 2.1), (2.4, 2.6), (2.0, 2.5), 0.1, False)
    assert judged.ratio == pytest.approx(1.25)
    assert judged.ratio_low == pytest.approx(2.4 / 2.1) and judged.ratio_high == pytest.approx(2.6 / 1.9)


def test_decode_tokens_per_s_borrows_tpots_interval_inverted_and_slower_means_fewer_tokens():
    rate = BY_NAME[Metric.DECODE_TOKENS_PER_S]
    metrics = {Metric.DECODE_TOKENS_PER_S: 500.0, Metric.TPOT_MS: 2.0, ci_low(Metric.TPOT_MS): 1.6}
    metrics[ci_high(Metric.TPOT_MS)] = 2.5
    low, high = interval(metrics, rate)
    assert (low, high) == (pytest.approx(500 * 2.0 / 2.5), pytest.approx(500 * 2.0 / 1.6))  # 400 .. 625
    assert judge(rate, (400.0, 625.0), (150.0, 210.0), (500.0, 180.0), 0.5, False).verdict == "slower"


def test_kv_cache_bytes_are_exact_memory_peaks_get_their_own_allowance():
    kv, peak = BY_NAME[Metric.KV_CACHE_BYTES], BY_NAME[Metric.PEAK_HOST_RSS_BYTES]
    assert judge(kv, (1000.0, 1000.0), (1000.0, 1000.0), (1000.0, 1000.0), 0.5, False).verdict == "same"
    assert judge(kv, (1000.0, 1000.0), (1001.0, 1001.0), (1000.0, 1001.0), 0.5, False).verdict == "larger"
    thresholds = Thresholds()  # defaults: timings 0.6, memory 0.05
    assert thresholds.of(Metric.PEAK_HOST_RSS_BYTES) == 0.05 and thresholds.of(Metric.TTFT_MS) == 0.6
    # 106 / 100 = 1.06 > 1.05: larger; 104 / 100 is within the memory allowance
    assert judge(peak, (100.0, 100.0), (106.0, 106.0), (100.0, 106.0), 0.05, False).verdict == "larger"
    assert judge(peak, (100.0, 100.0), (104.0, 104.0), (100.0, 104.0), 0.05, False).verdict == "within noise"


def test_cells_match_by_grid_coordinates_and_status_changes_away_from_ok_are_regressions():
    a = side(result(cell("dynamic")), result(cell("static")), result(cell("dynamic", batch=2), status=OOM))
    b = side(
        result(cell("dynamic"), (2.0, 1.95, 2.05)),  # within its own noise
        result(cell("static"), status=OOM),  # ok -> oom: a regression
        result(cell("dynamic", batch=2)),  # oom -> ok: reported, not a regression
        result(cell("dynamic", context=128)),  # only in B
    )
    comparison = compare_sweeps(a, b, Thresholds())
    rows = {(r.cell, r.metric): r for r in comparison.rows}
    assert rows[(cell("dynamic"), Metric.TPOT_MS)].verdict == "within noise"
    static = rows[(cell("static"), STATUS_METRIC)]
    assert (static.a, static.b, static.regression) == (OK, OOM, True)
    assert rows[(cell("dynamic", batch=2), STATUS_METRIC)].regression is False
    assert rows[(cell("dynamic", context=128), CELL_METRIC)].verdict == "added"
    assert comparison.matched == 3 and comparison.exit_code == 1
    assert ordered(comparison.rows)[0] is static  # regressions first


def test_a_contended_cell_gets_no_timing_verdict_but_its_memory_is_still_judged():
    mem = Metric.PEAK_HOST_RSS_BYTES
    a = side(result(cell(), **{mem: 100.0}))
    b = side(result(cell(), (9.0, 8.5, 9.5), contended=True, **{mem: 200.0}))
    comparison = compare_sweeps(a, b, Thresholds())
    assert verdicts(comparison) == {cell(): "contended"}
    assert verdicts(comparison, mem) == {cell(): "larger"}


def test_a_repeat_of_a_sets_each_metrics_threshold_to_the_largest_drift_it_showed():
    a = [result(cell("dynamic"), (2.0, 1.9, 2.1)), result(cell("static"), (4.0, 3.9, 4.1))]
    repeat = [result(cell("dynamic"), (2.6, 2.5, 2.7)), result(cell("static"), (3.0, 2.9, 3.1))]
    thresholds = drift_thresholds(a, repeat, Thresholds(0.0, 0.0), "r" * 32)
    # dynamic 2.6/2.0 = 1.3 (0.30), static 4.0/3.0 = 1.333 (0.333): the larger
    assert thresholds.of(Metric.TPOT_MS) == pytest.approx(1 / 3)
    assert thresholds.baseline_cells == 2
    # B slowed dynamic by 1.4x: beyond the repeat's 1/3 -> slower; by 1.3x: within what a rerun moves
    b = side(result(cell("dynamic"), (2.8, 2.75, 2.85)), result(cell("static"), (5.2, 5.1, 5.3)))
    comparison = compare_sweeps(side(*a), b, thresholds)
    assert verdicts(comparison) == {cell("dynamic"): "slower", cell("static"): "within noise"}
    # a floor the user gives still holds
    assert drift_thresholds(a, repeat, Thresholds(0.5, 0.0), "r").of(Metric.TPOT_MS) == 0.5


def test_the_header_names_what_differs_between_environments_and_protocols():
    env_a = {"torch_version": "2.13.0", "hostname": "node1", "device_name": "H100"}
    env_b = {"torch_version": "2.14.1", "hostname": "node1", "device_name": "H100"}
    a = side(result(cell(), environment=env_a), params={"measure.repeats": "3", "grid.caches": "[dynamic]"})
    b = side(result(cell(), environment=env_b), params={"measure.repeats": "5", "grid.caches": "[static]"})
    lines = header_lines(compare_sweeps(a, b, Thresholds()))
    assert "environment differs: torch 2.13.0 -> 2.14.1" in lines
    assert "environment same: device H100; host node1" in lines
    protocol = next(line for line in lines if line.startswith("protocol"))
    assert "measure.repeats 3 -> 5" in protocol and "grid.caches" not in protocol  # the grid is what is matched


def test_the_header_names_other_code_even_where_every_version_number_is_the_same():
    """Two sweeps by kvsweep 0.1.0 whose sources differ (one node edited by hand): the version alone hides it."""
    same = {"kvsweep_version": "0.1.0", "transformers_version": "5.25.0"}
    a = side(result(cell(), environment={**same, "node_software": "1a2b3c4d5e6f"}), params={})
    b = side(result(cell(), environment={**same, "node_software": "9f8e7d6c5b4a"}), params={})
    lines = header_lines(compare_sweeps(a, b, Thresholds()))
    assert "environment differs: node software 1a2b3c4d5e6f -> 9f8e7d6c5b4a" in lines, lines


def test_the_slow_fault_carries_its_delay_and_is_refused_without_one():
    seams = seams_from({"faults": [{"fault": "slow", "match": {"cache": "static"}, "ms_per_token": 20}]})
    chosen = fault_for(cell("static").to_dict(), seams.faults)
    assert chosen is not None and (chosen.kind, chosen.ms_per_token) == ("slow", 20.0)
    assert fault_for(cell("dynamic").to_dict(), seams.faults) is None
    for bad, word in (
        ({"fault": "slow"}, "needs it"),
        ({"fault": "error", "ms_per_token": 5}, "no other fault"),
        ({"fault": "slow", "ms_per_token": -1}, "not a positive number"),
    ):
        with pytest.raises(ConfigError, match=word):
            seams_from({"faults": [bad]})


def test_no_ratio_is_invented_for_a_zero_baseline():
    agreement = BY_NAME[Metric.KL_DIVERGENCE]
    judged = judge(agreement, (0.0, 0.0), (0.2, 0.2), (0.0, 0.2), 0.05, False)
    assert math.isinf(judged.ratio) and judged.verdict == "worse"  # 0 -> 0.2 nats, beyond its 0.01 floor
    assert judge(agreement, (0.0, 0.0), (0.005, 0.005), (0.0, 0.005), 0.05, False).verdict == "within noise"
