"""The capacity report: frontiers rebuilt from search probes alone, capacity.csv, the line per context, the
quality refusal, the frontier tags, the figure, and a search's lone probes kept out of the decision list.

Every expectation is worked out by hand from the probes built here. Searches walk the way
capacity/search_steps.py says: from the predicted batch p, up by 1, 2, 4 ... above p until a probe fails,
then halve the bracket. The SLO is tpot <= 50 ms on the interval's upper end. Fast tier: the one MLflow
round trip (`kvsweep report`) uses a copied sqlite store, no server.
"""

import csv
import io
import shutil

import pytest
from mlflow import MlflowClient

from kvsweep.capacity.frontier import SearchSettings, Slo, frontiers
from kvsweep.cli.report import capacity_context, rebuild_report
from kvsweep.grid import Cell
from kvsweep.names import CAPACITY_CSV, Metric, ResultTag, ci_high, ci_low
from kvsweep.report.report_files import CapacityContext, ReportContext, write_report
from kvsweep.report.selection import Settings
from kvsweep.results import OK, OOM, CellResult
from kvsweep.tracking.client import SweepTracker

SLO = Slo(tpot_ms=50.0)
SEARCH = SearchSettings(SLO, max_batch=16, context_step=1024, max_context=0)
QUANTIZED = "quantized-hqq-int4"
# Clopper-Pearson 95% intervals for 16 trials (as in test_quality_gate.py): 15/16 and 5/16.
PASSKEY_15 = {Metric.PASSKEY_ACCURACY: 15 / 16, ci_low(Metric.PASSKEY_ACCURACY): 0.6977}
PASSKEY_15 |= {ci_high(Metric.PASSKEY_ACCURACY): 0.9984}
PASSKEY_5 = {Metric.PASSKEY_ACCURACY: 5 / 16, ci_low(Metric.PASSKEY_ACCURACY): 0.1102}
PASSKEY_5 |= {ci_high(Metric.PASSKEY_ACCURACY): 0.5866}


def probe(cache, batch, tpot_high=None, goodput=100.0, context=256, search="batch", status=OK, **metrics):
    """One search probe: `tpot_high` is the upper end of its tpot interval (what the SLO judges)."""
    cell = Cell("org/served", "bfloat16", context, batch, 32, cache, False)
    if status == OK:
        metrics = {
            Metric.TPOT_MS: tpot_high - 2.0,
            ci_low(Metric.TPOT_MS): tpot_high - 4.0,
            ci_high(Metric.TPOT_MS): tpot_high,
            Metric.TTFT_MS: 90.0,
            ci_high(Metric.TTFT_MS): 100.0,
            Metric.KV_CACHE_BYTES: 1000.0 * batch,
            Metric.DECODE_TOKENS_PER_S: goodput,
            **metrics,
        }
    error = "CUDA out of memory" if status == OOM else ""
    return CellResult(f"{cache}-ctx{context}-bs{batch}", cell, status, error, metrics, tags={ResultTag.SEARCH: search})


def dynamic_search(**quality):
    """No useful prediction (1): probes 1, 2, 3 pass, 5 runs out of memory, then 4 passes: max batch 4, memory."""
    predicted = {Metric.PREDICTED_MAX_BATCH: 1.0}
    probes = [probe("dynamic", b, 10.0 + 5 * b, goodput=50.0 * b, **predicted) for b in (1, 2, 3)]
    probes.append(probe("dynamic", 5, status=OOM, **predicted))
    probes.append(probe("dynamic", 4, 30.0, goodput=200.0, **predicted, **quality))
    return probes


def quantized_search(cache=QUANTIZED, **quality):
    """Predicted 4: 4, 5, 6, 8 pass, 12 misses the SLO, then 10 and 9 miss it: max batch 8, slo_tpot."""
    predicted = {Metric.PREDICTED_MAX_BATCH: 4.0}
    highs = {4: 25.0, 5: 30.0, 6: 35.0, 12: 70.0, 10: 58.0, 9: 52.0}
    probes = [probe(cache, b, high, goodput=40.0 * b, **predicted) for b, high in highs.items()]
    probes.append(probe(cache, 8, 45.0, goodput=400.0, **predicted, **{Metric.JOULES_PER_TOKEN: 0.5}, **quality))
    return probes


def report(tmp_path, results, gpu_hour_cost=0.0, gpus_per_cell=1):
    capacity = CapacityContext(SEARCH, gpu_hour_cost=gpu_hour_cost, gpus_per_cell=gpus_per_cell)
    return write_report(results, tmp_path, ReportContext("capacity", Settings(), capacity=capacity))


def csv_rows(folder):
    return {row["cache"]: row for row in csv.DictReader(io.StringIO((folder / CAPACITY_CSV).read_text()))}


def test_capacity_csv_has_each_frontier_with_its_limit_goodput_and_cost(tmp_path):
    # 3.6 per GPU-hour x 2 GPUs = 0.002 per second; at 400 tok/s a million tokens take 2500 s: 5.0, at 200: 10.0.
    rep = report(tmp_path, dynamic_search() + quantized_search(), gpu_hour_cost=3.6, gpus_per_cell=2)
    rows = csv_rows(tmp_path)
    dynamic, quantized = rows["dynamic"], rows[QUANTIZED]
    assert (dynamic["axis"], dynamic["context_length"], dynamic["batch_size"]) == ("batch", "256", "")
    assert (dynamic["max_batch"], dynamic["max_context"], dynamic["limit"]) == ("4", "", "memory")
    assert (dynamic["predicted_max_batch"], dynamic["probes"], dynamic["pick"]) == ("1", "5", "false")
    assert float(dynamic["goodput_tokens_per_s"]) == 200.0 and float(dynamic["tpot_ms_ci_high"]) == 30.0
    assert float(dynamic["cost_per_1m_tokens"]) == pytest.approx(10.0)
    assert dynamic["joules_per_token"] == "" and dynamic["cell_id"] == "dynamic-ctx256-bs4"
    assert "out of memory" in dynamic["detail"]
    assert (quantized["max_batch"], quantized["limit"], quantized["probes"]) == ("8", "slo_tpot", "7")
    assert (quantized["predicted_max_batch"], quantized["pick"], quantized["quality_refusal"]) == ("4", "true", "")
    assert float(quantized["goodput_tokens_per_s"]) == 400.0 and float(quantized["joules_per_token"]) == 0.5
    assert float(quantized["tpot_ms_ci_high"]) == 45.0 and float(quantized["ttft_ms_ci_high"]) == 100.0
    assert float(quantized["cost_per_1m_tokens"]) == pytest.approx(5.0)
    assert quantized["detail"] == "tpot_ms 52 ms at the 95% upper end > 50 ms"  # batch 9, just past it
    assert [f.value for f in rep.frontiers] == [4, 8]


def test_the_line_per_context_picks_the_largest_batch_and_costs_it_beside_dynamic(tmp_path):
    rep = report(tmp_path, dynamic_search() + quantized_search(), gpu_hour_cost=3.6, gpus_per_cell=2)
    line = (
        "org/served bfloat16 new32: most capacity at ctx 256 within tpot <= 50 ms: quantized-hqq-int4 "
        "(batch 8, 400 tok/s, 5 per 1M tokens; dynamic: batch 4, 200 tok/s, 10 per 1M tokens)"
    )
    assert line in rep.short_form.splitlines()[-1]
    assert line in (tmp_path / "selection.md").read_text()
    markdown = (tmp_path / "selection.md").read_text()
    assert (
        "| 256 | max batch 4 · 200 tok/s · mem (pred 1) | max batch 8 · 400 tok/s · slo tpot (pred 4) · **pick** |"
        in (markdown)
    )
    assert "max batch 8 · 400 tok/s · slo tpot (pred 4) · <b>pick</b>" in (tmp_path / "report.html").read_text()


def test_equal_batches_go_to_the_higher_goodput_and_without_a_cost_there_is_no_cost(tmp_path):
    # Both reach batch 2 at ctx 1024 (batch 3 runs out of memory); dynamic decodes faster there.
    results = []
    for cache, goodput in (("dynamic", 180.0), (QUANTIZED, 150.0)):
        predicted = {Metric.PREDICTED_MAX_BATCH: 2.0}
        results += [probe(cache, 2, 40.0, goodput, 1024, **predicted), probe(cache, 3, None, 0, 1024, status=OOM)]
    rep = report(tmp_path, results)
    assert rep.short_form.splitlines()[-1].endswith(
        "most capacity at ctx 1024 within tpot <= 50 ms: dynamic (batch 2, 180 tok/s)"
    )
    assert {row["cost_per_1m_tokens"] for row in csv_rows(tmp_path).values()} == {""}


def test_a_cache_that_loses_the_task_is_refused_for_capacity_however_far_it_goes(tmp_path):
    results = dynamic_search(**PASSKEY_15) + quantized_search("quantized-quanto-int4", **PASSKEY_5)
    rep = report(tmp_path, results)
    refusal = "passkey 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00] at ctx 256 (independent intervals): quality loss"
    assert rep.short_form.splitlines()[-1].endswith(
        "within tpot <= 50 ms: dynamic (batch 4, 200 tok/s); "
        f"refused for quality: quantized-quanto-int4 (batch 8; {refusal})"
    )
    quanto = csv_rows(tmp_path)["quantized-quanto-int4"]
    assert (quanto["max_batch"], quanto["pick"], quanto["quality_refusal"]) == ("8", "false", refusal)
    assert "max batch 8 · 400 tok/s · slo tpot (pred 4) · refused: quality" in (tmp_path / "selection.md").read_text()


def test_without_dynamic_there_the_line_says_so(tmp_path):
    alone = report(tmp_path / "alone", quantized_search())
    assert alone.short_form.endswith("dynamic: no frontier at ctx 256 (not searched))")
    oom = [probe("dynamic", 1, status=OOM, **{Metric.PREDICTED_MAX_BATCH: 1.0})]
    nothing = report(tmp_path / "oom", oom + quantized_search())
    assert nothing.short_form.endswith("dynamic: none passed at ctx 256 (memory))")


def test_frontier_tags_name_each_frontier_probe_and_what_stopped_it(tmp_path):
    rep = report(tmp_path, dynamic_search() + quantized_search())
    assert rep.frontier_tags == {
        "dynamic-ctx256-bs4": {ResultTag.FRONTIER: "max_batch", ResultTag.FRONTIER_LIMIT: "memory"},
        f"{QUANTIZED}-ctx256-bs8": {ResultTag.FRONTIER: "max_batch", ResultTag.FRONTIER_LIMIT: "slo_tpot"},
    }


def test_a_probe_at_both_frontiers_carries_both_in_one_tag(tmp_path):
    # Batch search at ctx 2048 (predicted 1): bs1 passes, bs2 misses the SLO. Context search at bs1 (predicted
    # 2048, steps of 1024, up to 8192): 2048 passes, 3072 runs out of memory. Both end on (ctx 2048, bs1).
    both = {Metric.PREDICTED_MAX_BATCH: 1.0, Metric.PREDICTED_MAX_CONTEXT: 2048.0, Metric.SEARCH_MAX_CONTEXT: 8192.0}
    context_only = {Metric.PREDICTED_MAX_CONTEXT: 2048.0, Metric.SEARCH_MAX_CONTEXT: 8192.0}
    results = [
        probe("dynamic", 1, 30.0, 60.0, 2048, "batch+context", **both),
        probe("dynamic", 2, 80.0, 90.0, 2048, "batch", **{Metric.PREDICTED_MAX_BATCH: 1.0}),
        probe("dynamic", 1, None, 0, 3072, "context", OOM, **context_only),
    ]
    rep = report(tmp_path, results)
    tag = {ResultTag.FRONTIER: "max_batch+max_context", ResultTag.FRONTIER_LIMIT: "slo_tpot+memory"}
    assert rep.frontier_tags == {"dynamic-ctx2048-bs1": tag}
    rows = list(csv.DictReader(io.StringIO((tmp_path / CAPACITY_CSV).read_text())))
    assert [(r["axis"], r["context_length"], r["batch_size"], r["max_batch"], r["max_context"]) for r in rows] == [
        ("batch", "2048", "", "1", ""),
        ("context", "", "1", "", "2048"),
    ]
    assert rows[1]["predicted_max_context"] == "2048" and rows[1]["predicted_max_batch"] == ""
    assert rep.short_form.splitlines()[-1].endswith(
        "longest context at batch 1 within tpot <= 50 ms: dynamic (ctx 2048, 60 tok/s)"
    )


def test_the_capacity_figure_comes_first_among_the_plots(tmp_path):
    rep = report(tmp_path, dynamic_search() + quantized_search())
    assert rep.plots[0] == tmp_path / "plots" / "org_served_bfloat16_capacity.png"
    assert rep.plots[0].stat().st_size > 10_000
    assert 'alt="org_served_bfloat16_capacity"' in (tmp_path / "report.html").read_text()
    # Per-batch figures only where both caches were probed (batches 4 and 5): the rest would be one line each.
    facets = sorted(p.name for p in rep.plots[1:])
    assert facets == ["org_served_bfloat16_bs4_new32.png", "org_served_bfloat16_bs5_new32.png"], facets


def test_a_searchs_single_strategy_groups_are_left_out_of_the_decisions_but_kept_as_evidence(tmp_path):
    # Both caches probed batches 4 and 5 (two groups with a choice); the other 8 probes are alone in theirs.
    rep = report(tmp_path, dynamic_search() + quantized_search())
    selection = rep.short_form.split("Capacity (")[0]
    assert [line.split(":")[0].strip() for line in selection.splitlines()[1:-1]] == [
        "org/served bfloat16 bs4 ctx256 new32",
        "org/served bfloat16 bs5 ctx256 new32",
    ]
    assert "8 single-strategy groups left out of the decision list" in selection.splitlines()[-1]
    markdown = (tmp_path / "selection.md").read_text()
    decision, evidence = markdown.split("## Decision")[1].split("## Evidence")
    assert "bs1 ctx256" not in decision and "| 1 | 256 |" not in decision and "| 4 | 256 |" in decision
    assert "org/served bfloat16 bs1 ctx256 new32" in evidence and "bs12 ctx256" in evidence
    assert len(rep.decisions) == 10


def test_without_search_probes_every_group_is_listed(tmp_path):
    lone = probe("dynamic", 1, 20.0)
    lone.tags.clear()
    rep = write_report([lone], tmp_path, ReportContext("plain", Settings()))
    assert "left out" not in rep.short_form and "bs1 ctx256" in rep.short_form
    assert rep.frontiers == [] and rep.frontier_tags == {} and not (tmp_path / CAPACITY_CSV).exists()


def test_frontiers_are_the_same_whatever_order_the_probes_come_back_in():
    forward = frontiers(dynamic_search() + quantized_search(), SEARCH)
    backward = frontiers(list(reversed(dynamic_search() + quantized_search())), SEARCH)
    summary = sorted((f.key.cache, f.value, f.limit, f.probes) for f in forward)
    assert summary == sorted((f.key.cache, f.value, f.limit, f.probes) for f in backward)
    assert summary == [("dynamic", 4, "memory", 5), (QUANTIZED, 8, "slo_tpot", 7)]


def test_an_interrupted_search_is_unfinished_at_the_largest_batch_it_saw_pass(tmp_path):
    # Predicted 4: 4, 5 and 6 passed; the sweep stopped before 8 ran.
    probes = [p for p in quantized_search() if p.cell.batch_size in (4, 5, 6)]
    [frontier] = frontiers(probes, SEARCH)
    assert (frontier.value, frontier.limit, frontier.probes, frontier.limited_by) == (6, "unfinished", 3, None)
    rep = report(tmp_path, probes)
    assert "quantized-hqq-int4 (batch 6 (unfinished), 240 tok/s" in rep.short_form


def context_probe(context, status=OK, high=30.0, predicted=4096.0):
    metrics = {Metric.PREDICTED_MAX_CONTEXT: predicted, Metric.SEARCH_MAX_CONTEXT: 8192.0}
    return probe("dynamic", 1, high, 100.0, context, "context", status, **metrics)


def test_a_context_frontier_walks_in_steps_and_stops_at_memory_or_at_its_ceiling():
    # Steps of 1024 from the predicted 4096: 4096 passes, 5120 runs out of memory.
    [memory] = frontiers([context_probe(4096), context_probe(5120, OOM)], SEARCH)
    assert (memory.value, memory.limit, memory.at.cell.context_length) == (4096, "memory", 4096)
    assert memory.limited_by.cell.context_length == 5120
    # Everything passes: 4096, then 1, 2, 4 steps above it (5120, 6144, 8192): the ceiling, 8192.
    [ceiling] = frontiers([context_probe(c) for c in (4096, 5120, 6144, 8192)], SEARCH)
    assert (ceiling.value, ceiling.limit, ceiling.probes) == (8192, "search.max_context", 4)


def test_the_report_command_reads_the_search_back_from_the_parent_runs_params():
    params = {
        "search.batch": "True",
        "search.contexts": "False",
        "search.max_batch": "64",
        "search.max_context": "0",
        "search.context_step": "512",
        "slo.tpot_ms": "50.0",
        "slo.ttft_ms": "0.0",
        "report.gpu_hour_cost": "2.5",
        "ray.gpus_per_cell": "2",
    }
    expected = SearchSettings(Slo(50.0, 0.0), max_batch=64, context_step=512, max_context=0)
    assert capacity_context(params) == CapacityContext(expected, gpu_hour_cost=2.5, gpus_per_cell=2)
    assert capacity_context(params, 4.0).gpu_hour_cost == 4.0  # --gpu-hour-cost wins
    assert capacity_context({**params, "search.batch": "False"}) is None
    assert capacity_context({"report.max_kl": "0.005"}) is None  # a sweep from before searches existed


def test_the_report_command_rebuilds_capacity_from_mlflow_and_tags_the_frontier_probes(migrated_store, tmp_path):
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = SweepTracker(uri, "kvsweep")
    params = {"search.batch": True, "search.max_batch": 16, "slo.tpot_ms": 50.0, "ray.gpus_per_cell": 2}
    parent = tracker.start_sweep("cap", "key-cap", params, "name: cap\n")
    for result in dynamic_search() + quantized_search():
        run = tracker.open_cell(parent, result.cell_id, result.cell, "cuda", "cap")
        tracker.finish_cell(run, result, "cuda", {})
    assert rebuild_report(uri, "kvsweep", None, tmp_path / "out", {"gpu_hour_cost": 3.6}) == 0
    rows = csv_rows(tmp_path / "out")
    assert (rows["dynamic"]["max_batch"], rows[QUANTIZED]["max_batch"], rows[QUANTIZED]["pick"]) == ("4", "8", "true")
    assert float(rows[QUANTIZED]["cost_per_1m_tokens"]) == pytest.approx(5.0)  # the flag's 3.6 x 2 GPUs, 400 tok/s
    runs = MlflowClient(uri).search_runs([tracker.experiment_id], f"tags.`{ResultTag.FRONTIER}` = 'max_batch'")
    assert sorted(r.data.tags[ResultTag.FRONTIER_LIMIT] for r in runs) == ["memory", "slo_tpot"]
