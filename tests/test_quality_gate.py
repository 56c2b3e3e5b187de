"""The quality gate: a strategy that loses the task against dynamic, by intervals, is never picked.

Accuracies and their intervals are the textbook Clopper-Pearson values for 16 trials, written out
here: 16/16 is 0.7941-1, 15/16 0.6977-0.9984, 14/16 0.6165-0.9845, 5/16 0.1102-0.5866.
"""

import pytest

from kvsweep.grid import Cell
from kvsweep.names import Metric, ResultTag, ci_high, ci_low, passkey_depth_metric
from kvsweep.report.markdown import selection_markdown
from kvsweep.report.plots import draw_facets
from kvsweep.report.selection import Settings, decide, quality_loss_tags
from kvsweep.results import CellResult

INTERVALS_OF_16 = {
    16: (0.7941, 1.0),
    15: (0.6977, 0.9984),
    14: (0.6165, 0.9845),
    13: (0.5435, 0.9595),
    5: (0.1102, 0.5866),
}


def cell(cache, right=None, metric=Metric.PASSKEY_ACCURACY, context=4096, tpot=10.0, kv=1000.0, **extra):
    metrics = {Metric.TPOT_MS: tpot, Metric.TTFT_MS: 50.0, Metric.KV_CACHE_BYTES: kv, **extra}
    if right is not None:
        low, high = INTERVALS_OF_16[right]
        metrics |= {metric: right / 16, ci_low(metric): low, ci_high(metric): high, Metric.TASK_TRIALS: 16.0}
    return CellResult(
        f"{cache}-{context}", Cell("org/served", "bfloat16", context, 1, 32, cache, False), "ok", "", metrics
    )


def only(results, **settings):
    [decision] = decide(results, Settings(**settings))
    return decision


def test_a_lost_task_is_refused_even_as_the_fastest_and_leanest_with_both_accuracies_named():
    decision = only([cell("dynamic", 15), cell("quantized-quanto-int4", 5, tpot=6.0, kv=250.0)])
    assert decision.pick.label == "dynamic" and decision.leanest.label == "dynamic"
    line = "quantized-quanto-int4 (passkey 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00] at ctx 4096: quality loss)"
    assert f"refused: {line}" in decision.summary()
    assert quality_loss_tags([decision]) == {"quantized-quanto-int4-4096": {ResultTag.QUALITY_LOSS: "true"}}
    assert "passkey 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00]" in selection_markdown("t", [decision], {})


def test_a_drop_the_intervals_cannot_resolve_is_undecided_and_not_picked():
    # 13/16 against 16/16: 0.19 lower, but 0.96 (its high) is above dynamic's low 0.79.
    decision = only([cell("dynamic", 16), cell("quantized-hqq-int4", 13, tpot=6.0, kv=250.0)])
    assert decision.pick.label == "dynamic"
    assert "undecided, run more measure.quality_trials" in decision.summary()
    assert quality_loss_tags([decision])["quantized-hqq-int4-4096"] == {ResultTag.QUALITY_LOSS: "undecided"}


def test_within_the_allowed_drop_is_ok_and_still_picked():
    # 15/16 against 16/16 is 0.0625 lower: refused at the default 0.05 (undecided), fine at 0.10.
    results = [cell("dynamic", 16), cell("quantized-hqq-int8", 15, tpot=6.0, kv=500.0)]
    assert only(results).pick.label == "dynamic"
    decision = only(results, max_accuracy_drop=0.10)
    assert decision.pick.label == "quantized-hqq-int8" and decision.leanest.label == "quantized-hqq-int8"
    assert quality_loss_tags([decision]) == {"quantized-hqq-int8-4096": {ResultTag.QUALITY_LOSS: "false"}}
    # The same accuracy as dynamic is never a loss (a share the decimal limit would flip on floats).
    assert only([cell("dynamic", 14), cell("static", 14, tpot=6.0)]).pick.label == "static"


def test_kl_above_the_limit_refuses_and_low_agreement_alone_does_not():
    kl = only([cell("dynamic", 16), cell("quantized-hqq-int2", 16, tpot=6.0, kl_divergence=0.066)], max_kl=0.02)
    assert kl.pick.label == "dynamic" and "KL 0.066 nats > 0.02 from dynamic" in kl.summary()
    drift = only([cell("dynamic", 16), cell("quantized-hqq-int4", 16, tpot=6.0, token_agreement=0.5)])
    assert (
        drift.pick.label == "quantized-hqq-int4"
        and "flagged: quantized-hqq-int4 token agreement 0.50" in drift.summary()
    )


def test_a_prompts_files_answers_are_judged_the_same_way():
    decision = only(
        [
            cell("dynamic", 15, Metric.ANSWER_ACCURACY),
            cell("quantized-quanto-int2", 5, Metric.ANSWER_ACCURACY, tpot=5.0),
        ]
    )
    assert decision.pick.label == "dynamic"
    assert "answers 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00] at ctx 4096" in decision.summary()


def test_without_a_dynamic_cell_or_a_task_there_is_no_verdict():
    assert quality_loss_tags([only([cell("static", 5), cell("quantized-hqq-int4", 16, tpot=6.0)])]) == {}
    assert quality_loss_tags([only([cell("dynamic"), cell("quantized-hqq-int4", tpot=6.0)])]) == {}


def test_a_quality_figure_is_drawn_per_facet_with_a_task(tmp_path):
    results = [
        cell(cache, right, context=context, **{passkey_depth_metric(0.5): right / 16})
        for context in (1024, 4096)
        for cache, right in (("dynamic", 16), ("quantized-quanto-int2", 5))
    ]
    names = sorted(p.name for p in draw_facets(results, tmp_path, max_kl=0.02))
    assert names == ["org_served_bfloat16_bs1_new32.png", "org_served_bfloat16_bs1_new32_quality.png"]
    assert (tmp_path / names[1]).stat().st_size > 10_000


@pytest.mark.parametrize("shape_only", ["true"])
def test_random_weights_run_no_task_and_are_only_flagged(shape_only):
    results = [cell("dynamic"), cell("quantized-hqq-int2", tpot=6.0, kl_divergence=0.5, token_agreement=0.2)]
    for r in results:
        r.tags[ResultTag.SHAPE_ONLY] = shape_only
    decision = only(results, max_kl=0.02)
    assert decision.pick.label == "quantized-hqq-int2"
    assert any(f.startswith("shape-only (random weights)") for f in decision.entries[1].flags)
