"""The sweep report: the selection logic on its own, then a real sweep's report and its rebuild from MLflow."""

import re

import pytest
from matplotlib.image import imread
from mlflow import MlflowClient

from kvsweep.cli import main
from kvsweep.grid import Cell
from kvsweep.report.markdown import short_form
from kvsweep.report.pareto import pareto_frontier
from kvsweep.report.selection import Settings, decide
from kvsweep.results import CellResult


def result(cache, status="ok", model="org/trained", context=1024, compile=False, error="", tags=None, **metrics):
    cell = Cell(model, "bfloat16", context, 1, 32, cache, compile)
    defaults = {"tpot_ms": 10.0, "ttft_ms": 100.0, "kv_cache_bytes": 1000.0, "token_agreement": 1.0}
    return CellResult(
        f"{cache}-{context}", cell, status, error, {**defaults, **metrics} if status == "ok" else {}, tags=tags or {}
    )


def test_fastest_and_leanest_are_picked_with_costs_against_dynamic():
    [decision] = decide(
        [
            result("dynamic", tpot_ms=10.0, kv_cache_bytes=1000.0),
            result("static", tpot_ms=8.8, ttft_ms=103.0, kv_cache_bytes=1300.0),
            result("quantized-hqq-int4", tpot_ms=9.5, kv_cache_bytes=300.0),  # within 10% of 8.8
            result("quantized-hqq-int2", tpot_ms=9.9, kv_cache_bytes=200.0),  # 12.5% slower: out
        ],
        Settings(max_slowdown=0.10),
    )
    assert decision.pick.label == "static"
    assert decision.leanest.label == "quantized-hqq-int4"
    static = next(e for e in decision.entries if e.label == "static")
    assert static.deltas == pytest.approx({"TPOT": -0.12, "TTFT": 0.03, "memory": 0.30})
    line = short_form([decision])
    assert "fastest static" in line and "TPOT -12%, TTFT +3%, memory +30% vs dynamic" in line
    assert "leanest within 10%: quantized-hqq-int4 (TPOT -5%" in line and "memory -70%" in line


def test_failures_carry_their_status_and_rollback_advice():
    decisions = decide(
        [
            result("dynamic", status="oom", error="CUDA out of memory"),
            result("static", compile=True, status="error", error="BackendCompilerFailed"),
            result("offloaded", tpot_ms=30.0),
            result("quantized-quanto-int4", status="oom", tags={"kvsweep.inferred": "true"}),
        ],
        Settings(),
    )
    entries = {e.label: e for e in decisions[0].entries}
    assert "reduce max_new_tokens, context or batch, then try offloaded" in entries["dynamic"].advice
    assert "drop static/compile, return to dynamic" in entries["static+compile"].advice
    assert "even quantized" in entries["quantized-quanto-int4"].advice
    assert "inferred from a smaller cell's OOM" in entries["quantized-quanto-int4"].flags
    assert decisions[0].pick.label == "offloaded"  # the only one that fit
    assert entries["offloaded"].deltas == {}  # no dynamic numbers to compare against


def test_drifting_tokens_are_flagged_but_only_kl_or_the_task_refuses():
    """One early flipped token makes every later position differ: agreement alone never decides."""
    cells = [
        result("dynamic", tpot_ms=10.0),
        result("quantized-quanto-int2", tpot_ms=5.0, kv_cache_bytes=100.0, token_agreement=0.4, kl_divergence=0.001),
    ]
    [trained] = decide(cells, Settings(min_token_agreement=0.9, max_kl=0.02))
    quanto = trained.entries[1]
    assert "token agreement 0.40 < 0.90" in quanto.flags
    assert trained.pick.label == "quantized-quanto-int2" and trained.leanest.label == "quantized-quanto-int2"
    assert "flagged: quantized-quanto-int2 token agreement 0.40 < 0.90" in trained.summary()
    far = [cells[0], result("quantized-quanto-int2", tpot_ms=5.0, kv_cache_bytes=100.0, kl_divergence=0.11)]
    [refused] = decide(far, Settings(max_kl=0.02))
    assert refused.pick.label == "dynamic" and refused.leanest.label == "dynamic"
    assert "refused: quantized-quanto-int2 (KL 0.11 nats > 0.02 from dynamic)" in refused.summary()
    shape_only = [
        result(r.cell.cache, model="tiny-llama", tags={"kvsweep.shape_only": "true"}, **r.metrics) for r in far
    ]
    [preset] = decide(shape_only, Settings(max_kl=0.02))
    assert preset.pick.label == "quantized-quanto-int2"  # random weights: flagged, still eligible
    assert any(flag.startswith("shape-only (random weights)") for flag in preset.entries[1].flags)


def test_a_physically_impossible_timing_is_flagged_and_never_picked():
    """A static cell that read 40x the memory bandwidth would win on TPOT; it must not."""
    [decision] = decide(
        [
            result("dynamic", tpot_ms=10.0),
            result(
                "static",
                tpot_ms=0.5,
                decode_bandwidth_utilization=40.0,
                tags={"kvsweep.implausible": "true"},
            ),
        ],
        Settings(),
    )
    static = decision.entries[1]
    assert "implausible: decode read 40.00x the memory bandwidth" in static.flags
    assert decision.pick.label == "dynamic"


def test_the_results_table_marks_implausible_cells():
    from kvsweep.report.table import results_table

    impossible = result("static", tpot_ms=0.5, tags={"kvsweep.implausible": "true"})
    text = results_table([result("dynamic"), impossible])
    assert re.search(r"static\s+ok!", text) and "kvsweep.implausible=true" in text
    assert not re.search(r"dynamic\s+ok!", text)


def test_a_quantized_cache_slower_than_dynamic_is_advised_against_as_the_default():
    [decision] = decide([result("dynamic", tpot_ms=10.0), result("quantized-hqq-int4", tpot_ms=14.0)], Settings())
    assert "do not make a quantized cache the default" in decision.entries[1].advice


def test_low_agreement_means_below_the_sweeps_threshold():
    from kvsweep.tracking.journal import quality_tags

    def tag(agreement, params):
        return quality_tags(result("quantized-hqq-int4", token_agreement=agreement), params)

    assert tag(0.85, {}) == {"kvsweep.low_agreement": "true"}  # the default threshold is 0.9
    assert tag(0.9, {}) == {"kvsweep.low_agreement": "false"}  # "less than": the threshold itself passes
    assert tag(0.92, {"report.min_token_agreement": "0.95"}) == {"kvsweep.low_agreement": "true"}  # as logged
    assert quality_tags(result("dynamic", status="error"), {}) == {}  # no tokens, no verdict


def test_pareto_frontier_keeps_only_undominated_points():
    points = [(300.0, 9.5), (1000.0, 10.0), (1300.0, 8.8), (200.0, 12.0), (1300.0, 9.0)]
    assert pareto_frontier(points) == [(200.0, 12.0), (300.0, 9.5), (1300.0, 8.8)]


def _not_blank(path):
    pixels = imread(path)
    return pixels.shape[0] >= 400 and float(pixels[..., :3].std()) > 0.05


def test_sweep_writes_logs_and_prints_the_report_and_mlflow_alone_rebuilds_it(finished_sweep, tmp_path, capsys):
    """The shared sweep: contexts 64 and 192 x dynamic, static, offloaded, quantized-hqq-int4 (conftest)."""
    run = finished_sweep
    folder = run.run_dir / "report"
    assert "Selection (fastest by tpot_ms" in run.out and "tiny-llama float32 bs1 ctx192 new4: fastest" in run.out
    assert str(folder / "report.html") in run.out

    # one facet: one model, dtype, batch, new tokens (beside the forecast's figure: every cell's ratio)
    [plot] = (p for p in (folder / "plots").glob("*.png") if p.name != "forecast_ratio.png")
    assert plot.name == "tiny-llama_float32_bs1_new4.png" and _not_blank(plot)
    page = (folder / "report.html").read_text()
    assert '<table id="decision">' in page and '<table id="evidence">' in page
    assert page.count('src="data:image/png;base64,') == 2 and not re.search(r'src="(?!data:)', page)  # + forecast
    selection = (folder / "selection.md").read_text()
    assert re.search(r"\| \[?offloaded(\]\([^)]*\))? \| skipped \|", selection)  # failures are listed, not dropped
    assert "not run: offloaded needs CUDA" in selection

    client = MlflowClient(run.tracking_uri)
    parent = client.search_runs(["1"], "tags.`kvsweep.role` = 'sweep'")[0]
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/selection.md", "report/plots"} <= logged
    assert parent.data.params["report.max_slowdown"] == "0.1"
    cells = client.search_runs(["1"], "tags.`kvsweep.role` = 'cell' and tags.`kvsweep.status` = 'ok'")
    assert len(cells) == 6  # 2 contexts x (dynamic, static, hqq-int4); offloaded needs CUDA
    for c in cells:  # the tag against the cell's own logged agreement and the sweep's default threshold, 0.9
        agreement, tags = c.data.metrics["token_agreement"], c.data.tags
        assert tags["kvsweep.low_agreement"] == ("true" if agreement < 0.9 else "false"), (agreement, tags)
    dynamic = [c for c in cells if c.data.params["cache"] == "dynamic"]
    assert len(dynamic) == 2 and all(c.data.metrics["token_agreement"] == 1.0 for c in dynamic)  # agrees with itself

    capsys.readouterr()
    rebuilt = tmp_path / "rebuilt"
    assert main(["report", "--tracking-uri", run.tracking_uri, "--out", str(rebuilt)]) == 0
    out = capsys.readouterr().out
    assert "8 cells" in out and "Selection" in out
    assert (rebuilt / "selection.md").read_text() == selection  # same decisions, numbers and run links
    assert _not_blank(rebuilt / "plots" / plot.name)
    assert _not_blank(rebuilt / "plots" / "forecast_ratio.png")  # the ratios came back from MLflow too
    assert main(["report", "--tracking-uri", run.tracking_uri, "--out", str(rebuilt), "--max-slowdown", "5"]) == 0
    assert "leanest within 500%" in (rebuilt / "selection.md").read_text()
