"""Load levels: `workload.rate` as an axis, each cell's Poisson arrivals, and the saturation rule.

Expectations are worked out here by hand: the cells a rate list plans, the ids a fixed-shape grid had before the
axis existed (hard-coded, so a change to what an id hashes shows), the arrival times a rate draws, and which
rate each hand-built line of results sustains.
"""

import csv
import io
import itertools
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from conftest import cell_runs
from kvsweep.cli import main
from kvsweep.config.compose import compose_config
from kvsweep.errors import ConfigError
from kvsweep.grid import Cell, MeasureProtocol, cell_id, cell_label
from kvsweep.names import SATURATION_CSV, Metric
from kvsweep.plan.sweep_plan import plan_sweep
from kvsweep.plan.workload_cells import workload_cells
from kvsweep.report.load_levels import with_load_levels
from kvsweep.report.report_files import ReportContext, write_report
from kvsweep.report.saturation import (
    best_sustained,
    keeping_up,
    load_lines,
    saturation,
    saturation_csv,
    sustain_line,
)
from kvsweep.report.selection import Settings
from kvsweep.results import CellResult
from kvsweep.tracking.journal import Journal
from kvsweep.tracking.mlflow_ui import group_keys_from_config
from kvsweep.workload.request_mix import Request, RequestMix
from kvsweep.workload.workload_spec import rate_axis, workload_from_config

MIX = ['workload.input_lengths="fixed:64,200"', 'workload.output_lengths="fixed:8,16"', "workload.requests=6"]
PROTOCOL = MeasureProtocol.exact(warmup=1, repeats=3, seed=0, device="cpu", threads=1)


def kvsweep(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def lengths_spec(requests=6, rate=(), seed=0):
    workload = SimpleNamespace(
        source="lengths",
        name="chat",
        input_lengths="fixed:64,200",
        output_lengths="fixed:8,16",
        path="",
        requests=requests,
        serving=["sequential"],
        rate=list(rate),
        warmup_requests=1,
    )
    return workload_from_config(workload, seed=seed)


# -- config


def test_a_rate_list_composes_and_an_empty_one_is_a_closed_loop():
    assert compose_config(["workload.rate=[0.5,1,2]"]).config.workload.rate == [0.5, 1.0, 2.0]
    assert compose_config([]).config.workload.rate == []
    assert rate_axis([]) == [0.0] and rate_axis([0]) == [0.0]
    assert rate_axis([2, 0.5, 2, 0]) == [2.0, 0.5, 0.0]  # each once, in the config's order


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("workload.rate=2", "workload.rate is a list (an axis: one cell per value), e.g. 'workload.rate=[2]'"),
        ("workload.rate=[-1]", "workload.rate[0] must be >= 0, got -1.0"),
        ("workload.rate=[fast]", "workload.rate[0]"),
    ],
)
def test_a_bad_rate_is_one_line_and_exit_2_before_anything_starts(override, says, tmp_path):
    code, _, err = kvsweep("workload.source=lengths", *MIX, override, f"hydra.run.dir={tmp_path}/run")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_scalar_rate_in_a_sweep_file_is_one_line_too(tmp_path, monkeypatch):
    (tmp_path / "single.yaml").write_text("name: single\nworkload:\n  source: lengths\n  rate: 2\n")
    monkeypatch.setenv("KVSWEEP_SWEEPS_PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^workload\.rate is a list") as refused:
        compose_config(["+sweep=single"])
    assert len(str(refused.value).splitlines()) == 1


def test_a_rate_list_with_a_trace_that_has_arrival_times_is_refused_in_one_line(tmp_path):
    trace = tmp_path / "timed.jsonl"
    rows = [{"input_tokens": 8, "output_tokens": 2, "arrival_s": t} for t in (0.0, 0.5)]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    code, _, err = kvsweep(
        "workload.source=trace", f"workload.path={trace}", "workload.rate=[1,2]", f"hydra.run.dir={tmp_path}/run"
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"workload.rate=[1,2] would replace the arrival times of {trace}" in err
    # ...while 0 (a closed loop, here: the trace's own times) is no rate to refuse
    closed = ("workload.source=trace", f"workload.path={trace}", "workload.rate=[0]", f"hydra.run.dir={tmp_path}/dry")
    assert kvsweep(*closed, "dry_run=true")[0] == 0


# -- the grid


def test_fixed_shape_cell_ids_are_the_ones_they_were_before_the_rate_axis():
    """Computed before `rate` was a field: a new field must not change what an existing cell's id hashes."""
    assert cell_id(Cell("tiny-llama", "float32", 64, 1, 8, "dynamic", False), PROTOCOL) == "168e1db46ae8fa70"
    quantized = Cell("tiny-llama", "float32", 256, 2, 32, "static", True, weights="quanto-int8")
    assert cell_id(quantized, PROTOCOL) == "d348292e17129561"
    # ...and a closed-loop workload cell keeps its id too (rate 0 left out, as `workload`/`serving` are when "")
    closed = Cell("tiny-llama", "float32", 200, 1, 16, "dynamic", False, workload="chat", serving="sequential")
    assert cell_id(closed, replace(PROTOCOL, workload=lengths_spec())) == "5759bda4f63119c0"


def test_a_rate_list_plans_a_cell_per_cache_serving_mode_and_rate():
    cfg = compose_config(
        [
            "workload.source=lengths",
            *MIX,
            "workload.rate=[0.5,2]",
            "workload.serving=[sequential,continuous]",
            "grid.caches=[dynamic,paged]",
            "grid.batch_sizes=[2]",
            "grid.dtypes=[float32]",
            "device=cpu",
        ]
    ).config
    planned, _ = plan_sweep(cfg, "cpu")
    cells = [p.cell for p in planned]
    assert len(cells) == 2 * 2 * 2  # caches x serving modes x rates
    assert {(c.cache, c.serving, c.rate) for c in cells} == {
        (cache, mode, rate)
        for cache in ("dynamic", "paged")
        for mode in ("sequential", "continuous")
        for rate in (0.5, 2)
    }
    runs = {(p.cell.cache, p.cell.serving, p.cell.rate) for p in planned if p.runs}
    assert runs == {("dynamic", "sequential", 0.5), ("dynamic", "sequential", 2.0)} | {
        ("paged", mode, rate) for mode in ("sequential", "continuous") for rate in (0.5, 2.0)
    }  # continuous serves only paged, at every rate
    protocol = replace(PROTOCOL, workload=lengths_spec(rate=[0.5, 2]))
    ids = {cell_id(c, protocol) for c in cells}
    assert len(ids) == len(cells)  # distinct per rate
    paged = next(c for c in cells if (c.cache, c.serving, c.rate) == ("paged", "continuous", 2.0))
    assert cell_label(paged) == "paged lengths continuous@2rps bs2 float32 tiny-llama"
    assert cell_label(replace(paged, rate=0.5)) == "paged lengths continuous@0.5rps bs2 float32 tiny-llama"
    assert cell_label(replace(paged, rate=0.0)) == "paged lengths continuous bs2 float32 tiny-llama"


def test_a_cell_id_hashes_the_arrival_times_it_replays():
    spec = lengths_spec()
    cell = Cell("tiny-llama", "float32", 200, 1, 16, "dynamic", False, workload="chat", serving="sequential", rate=2.0)
    assert cell_id(cell, replace(PROTOCOL, workload=spec)) != cell_id(
        cell,
        replace(PROTOCOL, workload=replace(spec, seed=1)),  # the same rate, other arrival draws
    )
    assert spec.arrivals_sha256(2.0) == spec.mix_for("tiny-llama", 2.0).sha256


def test_the_mlflow_view_draws_a_line_per_rate_too():
    config = "grid: {caches: [dynamic, paged]}\nworkload: {source: lengths, serving: [sequential], rate: [1, 2]}\n"
    assert group_keys_from_config(config) == ["cache", "serving", "batch_size", "rate"]
    one = "grid: {caches: [dynamic, paged]}\nworkload: {source: lengths, serving: [sequential], rate: [2]}\n"
    assert group_keys_from_config(one) == ["cache", "serving", "batch_size"]


def test_rates_expand_in_the_config_order_after_serving_and_batch():
    spec = lengths_spec()
    grid = {"models": ["tiny-llama"], "dtypes": ["float32"], "batch_sizes": [2], "caches": ["dynamic"], "compile": [0]}
    cells = workload_cells(grid, ["sequential"], spec, {"tiny-llama": 4096}, [1.0, 0.5])
    assert [c.rate for c in cells] == [1.0, 0.5]
    assert workload_cells(grid, ["sequential"], spec, {"tiny-llama": 4096})[0].rate == 0.0  # the default


# -- arrivals


def test_every_cache_at_one_rate_gets_the_same_arrivals_and_their_mean_gap_is_one_over_the_rate():
    spec = lengths_spec(requests=40)
    at_two = spec.mix_for("tiny-llama", 2.0)
    assert at_two == spec.mix_for("tiny-llama", 2.0) == lengths_spec(requests=40).mix_for("other-model", 2.0)
    arrivals = [r.arrival_s for r in at_two.requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert arrivals[-1] / 39 == pytest.approx(1 / 2.0)  # given the last arrival at (n - 1)/rate: its mean gap
    assert len({round(b - a, 9) for a, b in itertools.pairwise(arrivals)}) > 30  # not evenly spaced
    assert at_two.offered_rate == pytest.approx(2.0)
    # each rate the same draws, scaled; the lengths as the closed loop's
    at_half = spec.mix_for("tiny-llama", 0.5)
    assert [r.arrival_s for r in at_half.requests] == pytest.approx([4 * t for t in arrivals])
    closed = spec.mix_for("tiny-llama")
    assert closed.offered_rate is None and all(r.arrival_s is None for r in closed.requests)
    assert [(r.input_tokens, r.output_tokens) for r in at_two.requests] == [
        (r.input_tokens, r.output_tokens) for r in closed.requests
    ]


def test_a_traces_own_arrivals_offer_n_minus_one_requests_over_their_span():
    mix = RequestMix("t", (Request(8, 2, 0.0), Request(8, 2, 1.0), Request(8, 2, 4.0)))
    assert mix.offered_rate == pytest.approx(2 / 4.0)
    assert RequestMix("t", (Request(8, 2, 0.0),)).offered_rate is None


# -- the saturation rule


def load(cache, rate, served, slo=True, status="ok", serving="sequential", batch=1, **metrics):
    cell = Cell("org/m", "float32", 200, batch, 16, cache, False, workload="chat", serving=serving, rate=rate)
    if status != "ok":
        return CellResult(f"{cache}-{serving}-{rate}", cell, status, "CUDA out of memory")
    m = {Metric.REQUESTS_PER_S: served, Metric.OFFERED_REQUESTS_PER_S: rate, **metrics}
    if slo:
        m[Metric.GOODPUT_REQUESTS_PER_S] = served
    return CellResult(f"{cache}-{serving}-{rate}", cell, status, metrics=m)


def test_the_highest_rate_whose_goodput_stays_within_5_percent_of_the_offered_one():
    [line] = saturation([load("dynamic", 1.0, 1.0), load("dynamic", 2.0, 1.96), load("dynamic", 4.0, 2.44)])
    assert (line.saturation_rate, line.next_rate) == (2.0, 4.0)
    assert line.limit == "goodput 0.61 of offered"  # 2.44 / 4
    assert [p.sustained for p in line.points] == [True, True, False]  # 1.96 / 2 = 0.98 holds


def test_without_an_slo_the_achieved_rate_is_judged():
    [line] = saturation([load("paged", 1.0, 0.97, slo=False), load("paged", 2.0, 1.8, slo=False)])
    assert (line.saturation_rate, line.next_rate, line.limit) == (1.0, 2.0, "requests/s 0.90 of offered")


def test_not_reached_none_sustained_a_failed_cell_and_the_first_failure_ends_the_line():
    results = [
        *(load("paged", r, r, serving="continuous", batch=4) for r in (1.0, 2.0, 4.0)),  # keeps up everywhere
        load("static", 1.0, 0.5),
        load("static", 2.0, 1.99),  # the lowest rate failed: a higher one that holds is not trusted
        load("quantized-fp8", 1.0, 1.0),
        load("quantized-fp8", 2.0, 0.0, status="oom"),
        load("quantized-fp8", 4.0, 0.0, status="skipped"),  # never ran: no point
        load("dynamic", 0.0, 3.0),  # a closed loop offers no rate
    ]
    found = {s.cache: s for s in saturation(results)}
    assert set(found) == {"paged", "static", "quantized-fp8"}
    assert (found["paged"].saturation_rate, found["paged"].next_rate, found["paged"].limit) == (4.0, None, "")
    assert (found["static"].saturation_rate, found["static"].next_rate) == (None, 1.0)
    assert found["static"].limit == "goodput 0.50 of offered"
    fp8 = found["quantized-fp8"]
    assert (fp8.saturation_rate, fp8.next_rate, fp8.limit) == (1.0, 2.0, "oom")
    assert [p.rate for p in fp8.points] == [1.0, 2.0]
    assert found["paged"].describe() == "sustains every rate tried, up to 4 req/s"
    assert fp8.describe() == "sustains 1 req/s (at 2: oom)"


def test_the_last_requests_own_time_after_the_last_arrival_is_not_counted_as_falling_behind():
    """32 requests at 2/s: the arrivals span 31 / 2 = 15.5 s, and a server keeping up ends the replay a request's
    time (e2e p50 1 s) later: 32 / 16.5 = 1.939 requests/s. 1.86 served is 0.959 of that (sustained); against
    the bare offered rate it would be 0.93."""
    assert keeping_up(2.0, {Metric.REPEATS: 32.0, Metric.E2E_MS_P50: 1000.0}) == pytest.approx(32 / 16.5)
    [line] = saturation([load("dynamic", 2.0, 1.86, **{Metric.REPEATS: 32.0, Metric.E2E_MS_P50: 1000.0})])
    assert line.points[0].share == pytest.approx(1.86 * 16.5 / 32) and line.saturation_rate == 2.0
    [bare] = saturation([load("dynamic", 2.0, 1.86)])  # without the count and latency: the offered rate itself
    assert bare.saturation_rate is None and bare.limit == "goodput 0.93 of offered"


def test_the_selection_line_names_the_cache_and_serving_mode_that_sustains_the_most():
    results = [
        load("dynamic", 1.0, 1.0),
        load("dynamic", 2.0, 1.2),
        *(load("paged", r, s, serving="continuous", batch=4) for r, s in ((1.0, 1.0), (2.0, 2.0), (4.0, 2.6))),
        load("static", 1.0, 1.0),
        load("static", 2.0, 1.5),  # sustains 1 as dynamic does, but served more at 2: ahead of dynamic in a tie
    ]
    found = saturation(results)
    best = best_sustained(found)
    assert list(best) == [("org/m", "float32", "none", "chat")]
    winner = best[("org/m", "float32", "none", "chat")]
    assert winner.label == "paged continuous B4"
    line = sustain_line(winner, "chat on m float32")
    assert line == "chat on m float32: paged continuous B4 sustains 2 req/s (at 4: goodput 0.65 of offered)"
    without_paged = best_sustained(s for s in found if s.cache != "paged")
    assert without_paged[("org/m", "float32", "none", "chat")].cache == "static"
    assert load_lines(results) == ["chat on org/m float32: " + line.removeprefix("chat on m float32: ")]
    failing = [load("dynamic", 1.0, 0.5), load("dynamic", 2.0, 0.6), load("dynamic", 0.0, 3.0, serving="batched")]
    assert load_lines(failing) == [
        "chat on org/m float32: no cache and serving mode sustains the lowest rate tried (1 req/s)"
    ]
    assert load_lines([load("dynamic", 0.0, 3.0)]) == []  # a closed loop only: no load line


def test_saturation_csv_has_a_row_per_cache_and_serving_mode_with_every_column():
    found = saturation([load("dynamic", 1.0, 1.0), load("dynamic", 2.0, 1.96), load("dynamic", 4.0, 2.44)])
    found += saturation([load("paged", r, r, serving="continuous", batch=4) for r in (1.0, 2.0)])
    rows = list(csv.DictReader(io.StringIO(saturation_csv(found, slo_ttft_ms=500.0))))
    assert rows == [
        {
            "model": "org/m",
            "dtype": "float32",
            "weights": "none",
            "workload": "chat",
            "cache": "dynamic",
            "serving": "sequential",
            "batch_size": "1",
            "saturation_rate": "2",
            "next_rate": "4",
            "slo_ttft_ms": "500",
            "slo_tpot_ms": "",
            "limit": "goodput 0.61 of offered",
        },
        {
            "model": "org/m",
            "dtype": "float32",
            "weights": "none",
            "workload": "chat",
            "cache": "paged",
            "serving": "continuous",
            "batch_size": "4",
            "saturation_rate": "2",
            "next_rate": "",
            "slo_ttft_ms": "500",
            "slo_tpot_ms": "",
            "limit": "not reached",
        },
    ]


def test_the_report_writes_saturation_csv_and_a_load_level_figure_and_table(tmp_path):
    latency = {Metric.TTFT_MS_P50: 10.0, Metric.TTFT_MS_P90: 20.0, Metric.E2E_MS_P50: 100.0, Metric.E2E_MS_P90: 200.0}
    results = [
        *(load("dynamic", r, s, **latency) for r, s in ((1.0, 1.0), (2.0, 1.96), (4.0, 2.44))),
        *(load("paged", r, r, **latency) for r in (1.0, 2.0, 4.0)),
    ]
    write_report(results, tmp_path / "report", ReportContext("rates", Settings(slo_ttft_ms=500.0)))
    rows = list(csv.DictReader((tmp_path / "report" / SATURATION_CSV).open()))
    assert [(r["cache"], r["saturation_rate"], r["next_rate"]) for r in rows] == [
        ("dynamic", "2", "4"),
        ("paged", "4", ""),
    ]
    assert (tmp_path / "report" / "plots" / "load_org_m_float32_chat.png").is_file()
    selection = (tmp_path / "report" / "selection.md").read_text()
    assert "### load levels: chat on org/m float32" in selection
    assert "| dynamic | sequential | 1 | 1.00 | 0.98 | 0.61 ✗ | 2 | 4 (goodput 0.61 of offered) |" in selection
    assert "| paged | sequential | 1 | 1.00 | 1.00 | 1.00 | 4 | not reached |" in selection
    assert "load levels: chat on org/m float32" in (tmp_path / "report" / "report.html").read_text()
    # a closed-loop sweep gets neither
    closed = [load("dynamic", 0.0, 3.0)]
    assert with_load_levels(None, closed, tmp_path / "closed") is None
    write_report(closed, tmp_path / "closed", ReportContext("closed", Settings()))
    assert not (tmp_path / "closed" / SATURATION_CSV).exists()


# -- a sweep, end to end


@pytest.fixture
def store(migrated_store, tmp_path) -> str:
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.mark.slow
def test_a_rate_list_sweep_offers_each_rate_and_writes_saturation_csv(ray_cluster, cell_template, store, tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = kvsweep(
        "grid.models=[tiny-llama]",
        "grid.dtypes=[float32]",
        "measure.threads=1",
        "workload.source=lengths",
        *MIX,
        "workload.warmup_requests=1",
        "workload.rate=[2,50]",
        "grid.caches=[dynamic,static]",
        "slo.ttft_ms=1000000",  # every request meets it: goodput is the request rate
        f"mlflow.tracking_uri={store}",
        f"hydra.run.dir={run_dir}",
    )
    assert code == 0, out + err
    results = {(r.cell.cache, r.cell.rate): r for r in Journal(run_dir).read().results}
    assert set(results) == {(c, r) for c in ("dynamic", "static") for r in (2.0, 50.0)}
    for (_, rate), result in results.items():
        assert result.status == "ok", result.error
        assert result.metrics[Metric.OFFERED_REQUESTS_PER_S] == rate
        assert result.metrics[Metric.REQUESTS_PER_S] > 0
    for rate in (2.0, 50.0):  # both caches offered the very same arrival times at one rate
        times = [[q["arrival_s"] for q in results[(c, rate)].samples["requests"]] for c in ("dynamic", "static")]
        assert times[0] == times[1]
        assert times[0][-1] == pytest.approx(5 / rate)  # 6 requests: the last at (n - 1)/rate
    _, children = cell_runs(store)
    params = {(c.data.params["cache"], c.data.params["rate"]) for c in children}
    assert params == {(c, r) for c in ("dynamic", "static") for r in ("2.0", "50.0")}
    assert all(c.data.metrics[Metric.OFFERED_REQUESTS_PER_S] == float(c.data.params["rate"]) for c in children)
    assert {c.data.tags["mlflow.runName"].split(" bs")[0] for c in children} == {
        f"{cache} lengths sequential@{r}rps" for cache in ("dynamic", "static") for r in ("2", "50")
    }
    parents, _ = cell_runs(store)  # the report folder, saturation.csv with it, is on the parent run
    logged = MlflowClient(tracking_uri=store).list_artifacts(parents[0].info.run_id, "report")
    assert f"report/{SATURATION_CSV}" in {a.path for a in logged}
    rows = list(csv.DictReader((run_dir / "report" / SATURATION_CSV).open()))
    assert [(r["cache"], r["serving"], r["slo_ttft_ms"]) for r in rows] == [
        ("dynamic", "sequential", "1e+06"),
        ("static", "sequential", "1e+06"),
    ]
    for row in rows:  # 6 tiny requests every 0.5 s: kept up with; at 50/s (all within 0.1 s) it depends on the CPU
        assert row["saturation_rate"] in ("2", "50")
        assert row["next_rate"] == ("50" if row["saturation_rate"] == "2" else "")
