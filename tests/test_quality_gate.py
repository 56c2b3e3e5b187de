"""The quality gate: a strategy that loses the task against dynamic, by intervals, is never picked; a task
dynamic itself fails judges nothing, and KL decides only where no task can.

Accuracies and their intervals are the textbook Clopper-Pearson values, written out here: of 16 trials,
16/16 is 0.7941-1, 15/16 0.6977-0.9984, 14/16 0.6165-0.9845, 12/16 0.4762-0.9273, 11/16 0.4134-0.8898,
5/16 0.1102-0.5866, 0/16 0-0.2059; of 4 trials, 3/4 is 0.1941-0.9937.
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
    12: (0.4762, 0.9273),
    11: (0.4134, 0.8898),
    5: (0.1102, 0.5866),
    0: (0.0, 0.2059),
}
INTERVALS_OF_4 = {3: (0.1941, 0.9937)}
INFORMATIVE_TAG = {ResultTag.TASK: "informative"}


def cell(cache, right=None, metric=Metric.PASSKEY_ACCURACY, context=4096, tpot=10.0, kv=1000.0, trials=16, **extra):
    metrics = {Metric.TPOT_MS: tpot, Metric.TTFT_MS: 50.0, Metric.KV_CACHE_BYTES: kv, **extra}
    if right is not None:
        low, high = (INTERVALS_OF_16 if trials == 16 else INTERVALS_OF_4)[right]
        metrics |= {metric: right / trials, ci_low(metric): low, ci_high(metric): high, Metric.TASK_TRIALS: trials}
    return CellResult(
        f"{cache}-{context}", Cell("org/served", "bfloat16", context, 1, 32, cache, False), "ok", "", metrics
    )


def only(results, **settings):
    [decision] = decide(results, Settings(**settings))
    return decision


def test_a_lost_task_is_refused_even_as_the_fastest_and_leanest_with_both_accuracies_named():
    decision = only([cell("dynamic", 15), cell("quantized-quanto-int4", 5, tpot=6.0, kv=250.0)])
    assert decision.pick.label == "dynamic" and decision.leanest.label == "dynamic"
    line = "quantized-quanto-int4 (passkey 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00] at ctx 4096 "
    line += "(independent intervals): quality loss)"
    assert f"refused: {line}" in decision.summary()
    assert quality_loss_tags([decision]) == {
        "dynamic-4096": INFORMATIVE_TAG,
        "quantized-quanto-int4-4096": {**INFORMATIVE_TAG, ResultTag.QUALITY_LOSS: "true"},
    }
    assert "passkey 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00]" in selection_markdown("t", [decision], {})


def test_a_drop_the_intervals_cannot_resolve_is_undecided_and_not_picked():
    # 13/16 against 16/16: 0.19 lower, but 0.96 (its high) is above dynamic's low 0.79.
    decision = only([cell("dynamic", 16), cell("quantized-hqq-int4", 13, tpot=6.0, kv=250.0)])
    assert decision.pick.label == "dynamic"
    assert "undecided, run more measure.quality_trials" in decision.summary()
    assert quality_loss_tags([decision])["quantized-hqq-int4-4096"] == {
        **INFORMATIVE_TAG,
        ResultTag.QUALITY_LOSS: "undecided",
    }


def test_within_the_allowed_drop_is_ok_and_still_picked():
    # 15/16 against 16/16 is 0.0625 lower: refused at the default 0.05 (undecided), fine at 0.10.
    results = [cell("dynamic", 16), cell("quantized-hqq-int8", 15, tpot=6.0, kv=500.0)]
    assert only(results).pick.label == "dynamic"
    decision = only(results, max_accuracy_drop=0.10)
    assert decision.pick.label == "quantized-hqq-int8" and decision.leanest.label == "quantized-hqq-int8"
    tags = quality_loss_tags([decision])
    assert tags["quantized-hqq-int8-4096"] == {**INFORMATIVE_TAG, ResultTag.QUALITY_LOSS: "false"}
    # The same accuracy as dynamic is never a loss (a share the decimal limit would flip on floats).
    assert only([cell("dynamic", 14), cell("static", 14, tpot=6.0)]).pick.label == "static"


def test_kl_above_the_limit_refuses_where_no_task_judges_and_low_agreement_alone_does_not():
    kl = only([cell("dynamic"), cell("quantized-hqq-int2", tpot=6.0, kl_divergence=0.066)], max_kl=0.02)
    assert kl.pick.label == "dynamic" and "KL 0.066 nats > 0.02 from dynamic" in kl.summary()
    assert quality_loss_tags([kl])["quantized-hqq-int2-4096"] == {ResultTag.TASK: "none"}
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


def test_where_the_task_is_kept_kl_over_the_limit_is_shown_but_refuses_nothing():
    """A cache that answers as dynamic does is not refused for the KL any lossy cache has."""
    results = [cell("dynamic", 16), cell("quantized-hqq-int4", 16, tpot=6.0, kl_divergence=0.03)]
    decision = only(results, max_kl=0.02)
    assert decision.pick.label == "quantized-hqq-int4" and not decision.refused()
    assert "KL 0.03 nats > 0.02 from dynamic, task kept" in decision.entries[1].flags


def test_without_a_dynamic_cell_or_a_task_there_is_no_verdict():
    no_dynamic = quality_loss_tags([only([cell("static", 5), cell("quantized-hqq-int4", 16, tpot=6.0)])])
    assert no_dynamic["static-4096"] == {
        ResultTag.TASK: "uninformative: passkey unjudged at ctx 4096: no dynamic cell ran"
    }
    no_task = quality_loss_tags([only([cell("dynamic"), cell("quantized-hqq-int4", tpot=6.0)])])
    assert no_task == {"dynamic-4096": {ResultTag.TASK: "none"}, "quantized-hqq-int4-4096": {ResultTag.TASK: "none"}}


@pytest.mark.parametrize(
    ("dynamic_right", "trials", "informative"),
    [(16, 16, True), (12, 16, True), (11, 16, False), (5, 16, False), (3, 4, False)],
)
def test_a_task_dynamic_fails_or_cannot_resolve_judges_nothing(dynamic_right, trials, informative):
    """Informative only where dynamic scores at least 0.7 with an interval at most 0.5 wide: 12/16 (0.75,
    width 0.45) is; 11/16 (0.69) is not, nor 5/16, nor 3/4 (0.75, but its interval is 0.80 wide)."""
    lost = 0 if trials == 16 else None
    results = [
        cell("dynamic", dynamic_right, trials=trials),
        cell("quantized-hqq-int2", lost, tpot=6.0, kv=250.0, kl_divergence=0.001),
    ]
    if lost is None:  # 4 trials: the candidate scored 0 of 4 (interval 0-0.6024)
        results[1].metrics |= {
            "passkey_accuracy": 0.0,
            "passkey_accuracy_ci_low": 0.0,
            "passkey_accuracy_ci_high": 0.6024,
        }
    decision = only(results)
    tags = quality_loss_tags([decision])
    if informative:
        assert tags["quantized-hqq-int2-4096"] == {**INFORMATIVE_TAG, ResultTag.QUALITY_LOSS: "true"}
        assert decision.pick.label == "dynamic" and not decision.uninformative
        return
    low, high = (INTERVALS_OF_16 if trials == 16 else INTERVALS_OF_4)[dynamic_right]
    why = f"passkey uninformative at ctx 4096: dynamic {dynamic_right / trials:.2f} [{low:.2f}-{high:.2f}]"
    assert tags == {
        "dynamic-4096": {ResultTag.TASK: f"uninformative: {why}"},
        "quantized-hqq-int2-4096": {ResultTag.TASK: f"uninformative: {why}"},
    }
    assert decision.pick.label == "quantized-hqq-int2"  # nothing refused it: the task judged nothing, KL is small
    assert f"; {why}" in decision.summary()
    assert why in selection_markdown("t", [decision], {})  # the report's decision table says so too


def test_a_quality_figure_is_drawn_per_facet_with_a_task(tmp_path):
    results = [
        cell(cache, right, context=context, **{passkey_depth_metric(0.5): right / 16})
        for context in (1024, 4096)
        for cache, right in (("dynamic", 16), ("quantized-quanto-int2", 5))
    ]
    names = sorted(p.name for p in draw_facets(results, tmp_path, max_kl=0.02))
    assert names == ["org_served_bfloat16_bs1_new32.png", "org_served_bfloat16_bs1_new32_quality.png"]
    assert (tmp_path / names[1]).stat().st_size > 10_000


def test_the_kl_panel_shows_no_negative_divergence():
    """KL is never negative: its symlog axis starts at zero rather than mirroring its decades below it."""
    from kvsweep.report.plots import _quality_figure, colours, facet_key

    results = [
        cell(cache, 16, context=context, kl_divergence=kl)
        for context in (1024, 4096)
        for cache, kl in (("dynamic", 0.0), ("quantized-hqq-int8", 3e-6), ("quantized-hqq-int2", 1.4))
    ]
    figure = _quality_figure(facet_key(results[0]), "m", results, colours(results), 0.5)
    [kl] = [ax for ax in figure.axes if "KL" in ax.get_title()]
    bottom, top = kl.get_ylim()
    assert bottom == 0 and top > 1.4
    assert all(tick >= 0 for tick in kl.get_yticks() if bottom <= tick <= top)


@pytest.mark.parametrize("shape_only", ["true"])
def test_random_weights_run_no_task_and_are_only_flagged(shape_only):
    results = [cell("dynamic"), cell("quantized-hqq-int2", tpot=6.0, kl_divergence=0.5, token_agreement=0.2)]
    for r in results:
        r.tags[ResultTag.SHAPE_ONLY] = shape_only
    decision = only(results, max_kl=0.02)
    assert decision.pick.label == "quantized-hqq-int2"
    assert any(f.startswith("shape-only (random weights)") for f in decision.entries[1].flags)


def test_the_runs_end_names_only_groups_where_dynamic_itself_failed_its_task():
    from kvsweep.driver.sweep_finish import task_failures

    failed = only([cell("dynamic", 5), cell("quantized-hqq-int2", 0, tpot=6.0)])
    no_dynamic = only([cell("static", 16, context=1024), cell("quantized-hqq-int2", 0, context=1024, tpot=6.0)])
    fine = only([cell("dynamic", 16, context=2048), cell("quantized-hqq-int2", 0, context=2048, tpot=6.0)])
    text = task_failures([failed, no_dynamic, fine])
    assert text.startswith("Task judged nothing in 1 group(s), where dynamic itself failed it: ")
    assert "org/served bfloat16 bs1 ctx4096 new32 (passkey uninformative at ctx 4096: dynamic 0.31 [0.11-0.59])" in text
    assert "ctx1024" not in text and "ctx2048" not in text
    assert "task.jsonl" in text
    assert task_failures([fine]) == ""


# --- a suite of tasks ----------------------------------------------------------------------------------------


def suite_cell(cache, rights: dict[str, int], context=2048, tpot=10.0, kv=1000.0):
    """A cell of a task suite: each task's count of 16 right, with its Clopper-Pearson interval (written above)."""
    metrics = {Metric.TPOT_MS: tpot, Metric.TTFT_MS: 50.0, Metric.KV_CACHE_BYTES: kv}
    for task, right in rights.items():
        name = Metric.PASSKEY_ACCURACY if task == "passkey" else f"task_{task}_accuracy"
        low, high = INTERVALS_OF_16[right]
        metrics |= {name: right / 16, ci_low(name): low, ci_high(name): high}
    return CellResult(
        f"{cache}-{context}", Cell("org/served", "bfloat16", context, 1, 32, cache, False), "ok", "", metrics
    )


def test_each_task_judges_on_its_own_and_the_line_names_the_task_that_refused():
    """Dynamic does passkey and multi-key at 2048 but not variable tracking (5 of 16): vt judges nothing, and a
    cache that keeps the passkey but loses the multi-key needles is refused, by that task, by name."""
    dynamic = suite_cell("dynamic", {"passkey": 16, "niah_multikey": 15, "vt": 5})
    int4 = suite_cell("quantized-hqq-int4", {"passkey": 16, "niah_multikey": 5, "vt": 0}, tpot=6.0, kv=250.0)
    decision = only([dynamic, int4])
    assert decision.pick.label == "dynamic"
    refused = "quantized-hqq-int4 (multi-key NIAH 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00] at ctx 2048 "
    assert f"refused: {refused}(independent intervals): quality loss)" in decision.summary()
    why = "variable tracking uninformative at ctx 2048: dynamic 0.31 [0.11-0.59]"
    tags = quality_loss_tags([decision])
    assert tags["quantized-hqq-int4-2048"] == {
        ResultTag.TASK: f"informative: passkey, niah_multikey; uninformative: vt ({why})",
        ResultTag.QUALITY_LOSS: "true",  # the worst task's verdict: passkey was ok
    }
    page = selection_markdown("t", [decision], {})
    assert (
        "## Task quality" in page
        and "multi-key NIAH @ 2048" in page
        and "variable tracking @ 2048 (uninformative)" in page
    )
    assert "| quantized-hqq-int4 | 1.00 [0.79-1.00] | 0.31 [0.11-0.59] LOSS | 0.00 [0.00-0.21] |" in page


def test_a_cache_that_keeps_every_task_dynamic_does_is_eligible_whatever_it_does_on_the_others():
    dynamic = suite_cell("dynamic", {"passkey": 15, "niah_single": 16, "cwe": 0})  # cwe: beyond the model
    int8 = suite_cell("quantized-hqq-int8", {"passkey": 15, "niah_single": 16, "cwe": 0}, tpot=6.0, kv=500.0)
    decision = only([dynamic, int8])
    assert decision.pick.label == "quantized-hqq-int8" and not decision.refused()
    assert quality_loss_tags([decision])["quantized-hqq-int8-2048"][ResultTag.QUALITY_LOSS] == "false"
