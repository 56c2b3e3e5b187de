"""A pick a serving engineer can defend: paired tests where caches saw the same requests or trials, no winner on a
percentile without an interval, and no pick that is slower than dynamic beyond the allowance on another latency.

Expectations are worked out here by hand or by SciPy (an independent implementation), never read off the code."""

import csv
import io
import math
import random

import pytest
from scipy import stats

from kvsweep.grid import Cell
from kvsweep.measure.paired import FASTER, SLOWER, TIED, paired_accuracy, paired_ratio
from kvsweep.measure.statistics import fewest_for_interval, median_interval
from kvsweep.names import Metric, ci_high, ci_low
from kvsweep.report.markdown import short_form
from kvsweep.report.paired_verdicts import fill_paired_ratios, paired_trials
from kvsweep.report.pareto_table import front, pareto_csv
from kvsweep.report.quality_gate import LOSS, UNDECIDED, task_verdict
from kvsweep.report.selection import Settings, decide
from kvsweep.results import CellResult
from kvsweep.workload.latency_stats import percentile_with_interval


def sign_test_p(ratios: list[float], at: float) -> float:
    """Two-sided sign test of 'the median ratio is `at`', by hand: twice the smaller binomial tail."""
    above = sum(r > at for r in ratios)
    below = sum(r < at for r in ratios)
    n = above + below
    tail = sum(math.comb(n, k) for k in range(min(above, below) + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_the_paired_ratio_interval_is_the_sign_test_inverted():
    rng = random.Random(7)
    reference = [rng.uniform(50, 900) for _ in range(40)]
    mine = [r * rng.uniform(1.00, 1.12) for r in reference]
    ratio = paired_ratio(mine, reference)
    ratios = sorted(a / b for a, b in zip(mine, reference, strict=True))
    assert ratio.pairs == 40
    # inside the interval the sign test does not reject at 5%; just outside it does
    assert sign_test_p(ratios, (ratio.low + ratio.high) / 2) >= 0.05
    below = max(r for r in ratios if r < ratio.low)
    above = min(r for r in ratios if r > ratio.high)
    assert sign_test_p(ratios, (below + ratio.low) / 2) < 0.05
    assert sign_test_p(ratios, (above + ratio.high) / 2) < 0.05
    assert ratio.verdict == SLOWER and 1.0 < ratio.low < ratio.ratio < ratio.high < 1.12


def test_pairing_finds_a_slowdown_that_independent_intervals_cannot_see():
    """Requests of very different lengths: each cache's own median interval is wide, so a 5% slowdown on every
    request hides in their overlap; the same requests' ratios show it."""
    rng = random.Random(3)
    reference = [rng.choice([60.0, 250.0, 900.0]) * rng.uniform(0.98, 1.02) for _ in range(48)]
    mine = [r * 1.05 * rng.uniform(0.99, 1.01) for r in reference]
    a, b = median_interval(mine), median_interval(reference)
    assert a.low <= b.high and b.low <= a.high  # independent: overlapping, a "tie"
    ratio = paired_ratio(mine, reference)
    assert ratio.verdict == SLOWER and ratio.ratio == pytest.approx(1.05, abs=0.01)
    assert paired_ratio(reference, mine).verdict == FASTER
    # fewer than 6 pairs give no 95% interval: never a verdict
    assert paired_ratio(mine[:5], reference[:5]).verdict == TIED


def test_mcnemar_on_the_same_trials_matches_scipy_and_counts_only_discordant_trials():
    # 30 trials: the reference right on 27, mine on 20; mine lost 7 and gained none
    reference = [True] * 27 + [False] * 3
    mine = [True] * 20 + [False] * 7 + [False] * 3
    found = paired_accuracy(mine, reference)
    assert (found.lost, found.gained, found.trials) == (7, 0, 30)
    assert found.p_value == pytest.approx(2 * 0.5**7)  # exact: both tails of Binomial(7, 1/2) at 0
    assert found.p_value == pytest.approx(stats.binomtest(0, 7, 0.5).pvalue)
    assert found.difference == pytest.approx(-7 / 30)
    ci = stats.binomtest(0, 7, 0.5).proportion_ci(confidence_level=0.95, method="exact")
    assert found.low == pytest.approx(7 / 30 * (2 * ci.low - 1), abs=1e-6)
    assert found.high == pytest.approx(7 / 30 * (2 * ci.high - 1), abs=1e-6)
    assert found.high < 0  # significant: the drop's interval excludes 0
    # agreement on every trial: no difference, an interval from the discordance rate's bound
    same = paired_accuracy(reference, reference)
    bound = stats.binomtest(0, 30, 0.5).proportion_ci(method="exact").high
    assert same.p_value == 1.0 and same.difference == 0 and same.high == pytest.approx(bound, abs=1e-6)


def quality_cell(cache: str, verdicts: list[bool], kept: bool = True) -> CellResult:
    cell = Cell("org/served", "bfloat16", 4096, 1, 32, cache, False, inputs="passkey")
    n, right = len(verdicts), sum(verdicts)
    low, high = stats.binomtest(right, n).proportion_ci(method="exact")
    metrics = {
        Metric.TPOT_MS: 10.0 if cache == "dynamic" else 6.0,
        Metric.TTFT_MS: 100.0,
        Metric.KV_CACHE_BYTES: 1000.0 if cache == "dynamic" else 250.0,
        Metric.PASSKEY_ACCURACY: right / n,
        ci_low(Metric.PASSKEY_ACCURACY): low,
        ci_high(Metric.PASSKEY_ACCURACY): high,
    }
    trials = [
        {"prompt_index": i, "seed": 11, "kind": "passkey", "depth": 0.5, "expected": str(1000 + i), "correct": ok}
        for i, ok in enumerate(verdicts)
    ]
    return CellResult(f"{cache}-q", cell, "ok", metrics=metrics, trials=trials if kept else [])


def test_a_drop_mcnemar_resolves_is_a_loss_where_the_independent_intervals_stayed_undecided():
    dynamic = quality_cell("dynamic", [True] * 27 + [False] * 3)
    hqq = quality_cell("quantized-hqq-int4", [True] * 20 + [False] * 10)
    verdict = task_verdict(hqq, dynamic, max_accuracy_drop=0.05)
    assert verdict.verdict == LOSS and verdict.paired is not None
    assert "McNemar p=0.0156" in verdict.text()
    # the same accuracies without the trials at hand (a report rebuilt from MLflow): intervals overlap
    rebuilt = task_verdict(
        quality_cell("quantized-hqq-int4", [True] * 20 + [False] * 10, kept=False), dynamic, max_accuracy_drop=0.05
    )
    assert rebuilt.verdict == UNDECIDED and "independent intervals" in rebuilt.text()
    [decision] = decide([dynamic, hqq], Settings())
    assert decision.pick.label == "dynamic" and "McNemar" in decision.summary()


def test_a_sweep_read_back_from_mlflow_pairs_its_trials_as_the_live_one_did(migrated_store, tmp_path):
    """A resumed sweep and `kvsweep report` read cells back from MLflow: their task trials come back from each
    cell's task.jsonl, so the gate decides by McNemar as the live sweep did, not by the independent intervals."""
    import shutil

    from kvsweep.tracking.client import SweepTracker
    from kvsweep.tracking.store import cell_results

    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    tracker = SweepTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "kvsweep")
    parent = tracker.start_sweep("trials", "key", {}, "name: trials\n")
    live = [
        quality_cell("dynamic", [True] * 27 + [False] * 3),
        quality_cell("quantized-hqq-int4", [True] * 20 + [False] * 10),
    ]
    for result in live:
        run_id = tracker.open_cell(parent, result.cell_id, result.cell, "cpu", "trials")
        tracker.finish_cell(run_id, result, "cpu", {})
    read_back = cell_results(tracker.client, tracker.experiment_id, parent, trials=True)
    assert {r.cell_id: r.trials for r in read_back} == {r.cell_id: r.trials for r in live}
    [decision] = decide(read_back, Settings())
    assert "McNemar p=0.0156" in decision.summary() and decision.summary() == decide(live, Settings())[0].summary()


def test_trials_that_are_not_the_same_questions_are_not_paired():
    dynamic = quality_cell("dynamic", [True] * 16)
    other = quality_cell("static", [True] * 16)
    other.trials = [{**t, "seed": 12} for t in other.trials]
    assert paired_trials(other, dynamic) is None


def fixed(cache: str, tpot: tuple[float, float, float], ttft: tuple[float, float, float], kv: float) -> CellResult:
    cell = Cell("org/served", "float32", 512, 1, 32, cache, False)
    metrics = {Metric.KV_CACHE_BYTES: kv}
    for name, (value, low, high) in ((Metric.TPOT_MS, tpot), (Metric.TTFT_MS, ttft)):
        metrics |= {name: value, ci_low(name): low, ci_high(name): high}
    return CellResult(f"{cache}-512", cell, "ok", metrics=metrics)


def test_a_tpot_tie_is_not_won_by_a_cache_with_twice_the_ttft():
    """The README's real-model case: TPOT tied, HQQ int4 leanest, but its TTFT +103%."""
    results = [
        fixed("dynamic", (45.7, 44.9, 47.0), (120.0, 118.0, 123.0), 12.0e6),
        fixed("static", (46.3, 45.0, 47.9), (126.0, 122.0, 129.0), 13.0e6),
        fixed("quantized-hqq-int4", (49.9, 46.5, 52.0), (243.6, 236.0, 250.0), 2.4e6),
    ]
    [decision] = decide(results, Settings())
    assert decision.pick.label == "dynamic"  # of the tied candidates left, the least memory
    line = short_form([decision])
    assert "not picked: quantized-hqq-int4 (tied on tpot with dynamic): TTFT +103% > 10%" in line
    assert "pick quantized-hqq-int4" not in line and "leanest within 10%: quantized" not in line
    # waived by the user: TTFT no longer holds it back, and the tie goes to its memory
    [waived] = decide(results, Settings(waive_slowdown=("ttft_ms",)))
    assert waived.pick.label == "quantized-hqq-int4"
    # memory as the objective still respects the allowance
    [lean] = decide(results, Settings(objective="memory"))
    assert lean.pick.label == "dynamic" and "leanest dynamic" in lean.summary()


def workload_cell(cache: str, e2e: list[float], serving: str = "sequential", kv: float = 1e6) -> CellResult:
    cell = Cell("org/served", "float32", 400, 1, 16, cache, False, workload="mine", serving=serving)
    records = [
        {"input_tokens": 100 + i, "output_tokens": 16, Metric.TTFT_MS: v / 4, Metric.TPOT_MS: v / 20, Metric.E2E_MS: v}
        for i, v in enumerate(e2e)
    ]
    metrics = {Metric.KV_CACHE_BYTES: kv, Metric.REPEATS: float(len(e2e))}
    for timing in (Metric.TTFT_MS, Metric.TPOT_MS, Metric.E2E_MS):
        values = [r[timing] for r in records]
        for q in (50, 90, 99):
            est = percentile_with_interval(values, q)
            name = f"{timing}_p{q}"
            metrics[name] = est.value
            if est.ci_low is not None:
                metrics |= {ci_low(name): est.ci_low, ci_high(name): est.ci_high}
    return CellResult(f"{cache}-{serving}", cell, "ok", metrics=metrics, samples={"requests": records})


def test_twelve_requests_rank_by_p50_and_say_why():
    rng = random.Random(5)
    base = [rng.uniform(100, 400) for _ in range(12)]
    results = [workload_cell("dynamic", base), workload_cell("static", [v * 0.7 for v in base], kv=2e6)]
    assert fewest_for_interval(90) == 29  # 1 - 0.9^n - 0.1^n first reaches 0.95 at n = 29, by hand: 0.9^29 = 0.047
    [decision] = decide(results, Settings())
    assert decision.ranking.metric == "tpot_ms_p50"
    assert "ranked by p50: 12 requests give no p90 interval (29 do)" in decision.summary()
    assert decision.pick.label == "static" and "tpot p50 over requests" in decision.label


def test_workload_costs_are_paired_over_the_same_requests_and_logged_for_mlflow():
    rng = random.Random(9)
    base = [rng.choice([80.0, 300.0, 1200.0]) * rng.uniform(0.97, 1.03) for _ in range(40)]
    dynamic = workload_cell("dynamic", base)
    hqq = workload_cell("quantized-hqq-int4", [v * 1.3 for v in base], kv=3e5)
    found = fill_paired_ratios([[dynamic, hqq]])
    assert found[hqq.cell_id][Metric.PAIRED_RATIO_E2E] == pytest.approx(1.3)
    assert found[hqq.cell_id][ci_low(Metric.PAIRED_RATIO_TTFT)] == pytest.approx(1.3)
    [decision] = decide([dynamic, hqq], Settings())
    line = decision.summary()
    assert decision.pick.label == "dynamic"
    assert "per request (paired): TTFT +30% [+30%, +30%] slower" in line or "not picked: quantized-hqq-int4" in line
    assert "not picked: quantized-hqq-int4: TTFT p90 +30% > 10%" in line


def test_a_group_of_one_says_so_instead_of_naming_a_winner():
    [decision] = decide([workload_cell("paged", [100.0 + i for i in range(30)], serving="continuous")], Settings())
    assert "only paged ran here, nothing to compare it with" in decision.summary()
    assert "fastest" not in decision.summary()


def test_the_pareto_front_leaves_out_what_is_beaten_on_every_axis_and_marks_the_pick():
    results = [
        fixed("dynamic", (10.0, 9.9, 10.1), (100.0, 99.0, 101.0), 1000.0),
        fixed("static", (9.0, 8.9, 9.1), (100.0, 99.0, 101.0), 1300.0),  # faster, fatter: on the front
        fixed("offloaded", (12.0, 11.9, 12.1), (104.0, 103.0, 105.0), 1100.0),  # worse than dynamic on both
        fixed("quantized-hqq-int8", (10.5, 10.4, 10.6), (104.0, 103.0, 105.0), 500.0),  # leaner, slower: on it
    ]
    [decision] = decide(results, Settings())
    assert [p.entry.label for p in front(decision)] == ["static", "dynamic", "quantized-hqq-int8"]
    rows = list(csv.DictReader(io.StringIO(pareto_csv([decision]))))
    by_strategy = {r["strategy"]: r for r in rows}
    assert by_strategy["offloaded"]["on_front"] == "false"
    assert by_strategy["static"]["pick"] == "true" and by_strategy["dynamic"]["pick"] == "false"
    assert float(by_strategy["quantized-hqq-int8"]["memory_bytes"]) == 500.0


def test_the_first_lines_warn_when_the_mix_is_too_small_for_the_percentile_asked():
    from kvsweep.driver.first_lines import interval_warning

    [line] = interval_warning(12, "tpot_ms")
    assert "12 requests give report.rank_by's p90 no 95% interval (29 do" in line and "tpot_ms p50" in line
    assert interval_warning(29, "tpot_ms") == []
    [p99] = interval_warning(100, "ttft_ms_p99")
    assert "(299 do" in p99 and "ttft_ms p90" in p99
    [none] = interval_warning(4, "e2e_ms")
    assert "no percentile has an interval" in none


def test_goodput_picks_the_cache_serving_more_requests_within_the_slo_and_mcnemar_decides_the_tie():
    """30 requests: under the 300 ms TTFT SLO dynamic meets 20 (every 3rd misses), static all 30, HQQ int8 29;
    the goodput rates follow. Static and HQQ int8 differ on one request only (McNemar p = 1: tied, memory
    decides); static against dynamic differs on 10, all one way (p = 2 x 0.5^10)."""
    slo = 300.0
    ttft = {
        "dynamic": [400.0 if i % 3 == 0 else 200.0 for i in range(30)],
        "static": [250.0] * 30,
        "quantized-hqq-int8": [250.0] * 29 + [350.0],
    }
    results = []
    for cache, values in ttft.items():
        result = workload_cell(cache, [4 * v for v in values], kv={"quantized-hqq-int8": 5e5}.get(cache, 1e6))
        met = sum(v <= slo for v in values)
        result.metrics[Metric.GOODPUT_REQUESTS_PER_S] = met / 30.0
        results.append(result)
    settings = Settings(objective="goodput", slo_ttft_ms=slo, waive_slowdown=("ttft_ms", "tpot_ms", "e2e_ms"))
    [decision] = decide(results, settings)
    assert [e.label for e in decision.tied] == ["static", "quantized-hqq-int8"]
    assert decision.tie_test == "McNemar on requests within the SLOs"
    assert decision.pick.label == "quantized-hqq-int8"  # tied with static, and leaner
    # dynamic misses the SLO at its ranked percentile: it is no candidate at all
    assert any("dynamic" in line and "> SLO 300 ms" in line for line in decision.held_back())
