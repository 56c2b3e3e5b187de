"""The report's workload section: groups, per-request CDF figures, percentile tables, and its place in the report."""

from dataclasses import asdict

import pytest

from kvsweep.cell.workload_replay import RequestTimes
from kvsweep.grid import Cell
from kvsweep.report.compile_payback import CALL, SERVICE_MS, payback_findings, payback_text
from kvsweep.report.report_files import ReportContext, write_report
from kvsweep.report.selection import Settings
from kvsweep.report.workload_quality import fill_agreement
from kvsweep.report.workload_report import (
    E2E,
    TTFT,
    draw_workloads,
    latency_cdf,
    workload_figure,
    workload_groups,
    workload_section,
    workload_tables,
)
from kvsweep.results import CellResult

MIB = 1 << 20
NOTE = "no interval: too few requests for an exact 95% interval at p99"


def requests(e2e, ttft):
    return [
        {
            "input_tokens": 100 + i,
            "output_tokens": 8,
            "arrival_s": None,
            "ttft_ms": t,
            "tpot_ms": (e - t) / 7,
            "e2e_ms": e,
            "queue_ms": 0.0,
        }
        for i, (e, t) in enumerate(zip(e2e, ttft, strict=True))
    ]


def workload(cache, compile=False, mix="chat", serving="continuous", batch=4, model="org/served", status="ok", **kw):
    cell = Cell(model, "bfloat16", 512, batch, 64, cache, compile, workload=mix, serving=serving)
    cid = f"{cache}{'+c' if compile else ''}-{mix}-{serving}-{batch}-{model}"
    if status != "ok":
        return CellResult(cid, cell, status, "CUDA out of memory")
    metrics = {"requests_per_s": 2.0, "kv_cache_bytes": 2 * MIB, **kw.pop("metrics", {})}
    return CellResult(cid, cell, status, metrics=metrics, samples={"requests": kw.pop("reqs", [])})


def plain(cache, context=256):
    cell = Cell("org/served", "bfloat16", context, 1, 32, cache, False)
    metrics = {"tpot_ms": 10.0, "ttft_ms": 100.0, "kv_cache_bytes": 1000.0, "token_agreement": 1.0}
    return CellResult(f"{cache}-{context}", cell, "ok", metrics=metrics)


def test_workload_cells_group_by_what_they_served_and_plain_cells_are_left_out():
    results = [
        workload("static", compile=True),
        workload("dynamic"),
        workload("dynamic", serving="batched"),
        workload("dynamic", mix="rag", batch=8),
        workload("dynamic", status="oom", model="org/other"),
        plain("dynamic"),
    ]
    groups = workload_groups(results)
    assert list(groups) == [
        ("org/other", "bfloat16", "none", "chat", "continuous", 4, 0.0),
        ("org/served", "bfloat16", "none", "chat", "batched", 4, 0.0),
        ("org/served", "bfloat16", "none", "chat", "continuous", 4, 0.0),
        ("org/served", "bfloat16", "none", "rag", "continuous", 8, 0.0),
    ]
    chat = groups[("org/served", "bfloat16", "none", "chat", "continuous", 4, 0.0)]
    assert [(r.cell.cache, r.cell.compile) for r in chat] == [("dynamic", False), ("static", True)]


def test_each_strategy_gets_an_empirical_cdf_of_its_requests(tmp_path):
    dynamic = workload("dynamic", reqs=requests(e2e=[30.0, 10.0, 20.0], ttft=[3.0, 1.0, 2.0]))
    static = workload("static", compile=True, reqs=requests(e2e=[40.0, 5.0], ttft=[100.0, 2.0]))
    failed = workload("offloaded", status="oom")
    assert latency_cdf(failed, E2E) is None
    cdf = latency_cdf(dynamic, E2E)
    assert (cdf.label, cdf.xs, cdf.ys) == ("dynamic", [10.0, 20.0, 30.0], [1 / 3, 2 / 3, 1.0])

    [(key, cells)] = workload_groups([dynamic, static, failed]).items()
    figure = workload_figure(key, "served", cells, {"dynamic": "#111111", "static+compile": "#222222"})
    e2e_axes, ttft_axes = figure.axes
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in e2e_axes.get_lines()}
    assert drawn == {"dynamic": ([10.0, 20.0, 30.0], [1 / 3, 2 / 3, 1.0]), "static+compile": ([5.0, 40.0], [0.5, 1.0])}
    ttft = {line.get_label(): list(line.get_xdata()) for line in ttft_axes.get_lines()}
    assert ttft == {"dynamic": [1.0, 2.0, 3.0], "static+compile": [2.0, 100.0]}
    assert e2e_axes.get_xscale() == "linear"  # 5..40 ms: 8x
    assert ttft_axes.get_xscale() == "log"  # 1..100 ms: 100x
    assert [e2e_axes.get_ylim()[0], ttft_axes.get_ylim()[0]] == [0, 0]
    assert {text.get_text() for text in e2e_axes.get_legend().get_texts()} == {"dynamic", "static+compile"}
    assert "served  bfloat16  workload chat  continuous  batch 4" in figure._suptitle.get_text()

    [path] = draw_workloads([dynamic, static, failed, plain("dynamic")], tmp_path / "plots").values()
    assert path == tmp_path / "plots" / "workload_org_served_bfloat16_chat_continuous_bs4.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert latency_cdf(dynamic, TTFT).xs == [1.0, 2.0, 3.0]


def test_odd_workload_names_make_safe_distinct_file_names(tmp_path):
    reqs = requests(e2e=[1.0], ttft=[0.5])
    paths = draw_workloads(
        [workload("dynamic", mix="a b/c", reqs=reqs), workload("dynamic", mix="a_b_c", reqs=reqs)], tmp_path
    )
    names = sorted(p.name for p in paths.values())
    assert names == [
        "workload_org_served_bfloat16_a_b_c_continuous_bs4-2.png",
        "workload_org_served_bfloat16_a_b_c_continuous_bs4.png",
    ]
    assert all(p.parent == tmp_path for p in paths.values())


def test_the_table_gives_percentiles_with_intervals_where_they_exist():
    metrics = {
        "ttft_ms_p50": 12.3,
        "ttft_ms_p50_ci_low": 11.9,
        "ttft_ms_p50_ci_high": 13.04,
        "ttft_ms_p99": 20.5,  # no interval: too few requests
        "tpot_ms_p90": 0.456,
        "tpot_ms_p90_ci_low": 0.4,
        "tpot_ms_p90_ci_high": 0.5,
        "e2e_ms_p99": 250.0,
        "requests_per_s": 3.25,
        "goodput_requests_per_s": 3.0,
        "kv_cache_bytes": 3 * MIB,
        "static_unused_share": 0.25,
        "padding_share": 0.125,
        "overgeneration_share": 0.375,
    }
    results = [
        workload("static", metrics=metrics),
        workload("dynamic", metrics={"ttft_ms_p50": 9.0, "requests_per_s": 4.0}),
        workload("offloaded", status="oom"),
    ]
    [table], missing = workload_tables(results, links={results[0].cell_id: "http://mlflow/run/1"})
    assert table.header == [
        "strategy",
        *(f"{t} {p} ms" for t in ("TTFT", "TPOT", "e2e") for p in ("p50", "p90", "p99")),
        "requests/s",
        "goodput req/s",
        "KV cache MiB",
        "static unused %",
        "padding %",
        "overgenerated %",
        "compile payback",
    ]
    dynamic, static = table.rows
    assert static == [
        ("static", "http://mlflow/run/1", ""),
        "12.3 [11.9–13.0]",
        "-",
        "20.5",
        "-",
        "0.46 [0.40–0.50]",
        "-",
        "-",
        "-",
        "250.0",
        "3.25",
        "3.00",
        "3.00",
        "25.0",
        "12.5",
        "37.5",
        "-",  # not compiled: nothing to pay back
    ]
    assert dynamic == ["dynamic", "9.0", *["-"] * 8, "4.00", "-", "2.00", "-", "-", "-", "-"]
    assert table.failed == ["offloaded: oom"]
    assert missing == ["p50", "p99"]  # dynamic's p50 has no interval either


def test_the_report_carries_the_section_only_when_the_sweep_has_workload_cells(tmp_path):
    reqs = requests(e2e=[30.0, 10.0, 20.0], ttft=[3.0, 1.0, 2.0])
    bare = {"e2e_ms_p99": 30.0}
    with_interval = {"e2e_ms_p50": 20.0, "e2e_ms_p50_ci_low": 10.0, "e2e_ms_p50_ci_high": 30.0}
    served = [
        workload("dynamic", reqs=reqs, metrics=bare),
        workload("static", compile=True, reqs=reqs, metrics=bare),
        workload("dynamic", mix="rag", reqs=reqs, metrics=with_interval),
        workload("offloaded", status="oom"),
    ]
    mixed = write_report(
        [plain("dynamic"), plain("static"), *served], tmp_path / "mixed", ReportContext("m", Settings())
    )
    page = (tmp_path / "mixed" / "report.html").read_text()
    md = (tmp_path / "mixed" / "selection.md").read_text()
    assert page.count('<h2 id="workloads">Workloads: your traffic</h2>') == 1
    assert 'id="workload-0"' in page and 'id="workload-1"' in page
    assert page.count(NOTE) == 1 and md.count(NOTE) == 1
    assert "20.0 [10.0–30.0]" in page and "20.0 [10.0–30.0]" in md
    assert md.count("## Workloads: your traffic") == 1
    assert "### org/served  bfloat16  workload chat  continuous  batch 4" in md
    assert "- offloaded: oom" in md and "<li>offloaded: oom</li>" in page
    figures = sorted(p.name for p in mixed.workloads.plots)
    assert figures == [
        "workload_org_served_bfloat16_chat_continuous_bs4.png",
        "workload_org_served_bfloat16_rag_continuous_bs4.png",
    ]
    assert all((tmp_path / "mixed" / "plots" / name).is_file() for name in figures)
    assert page.count("data:image/png;base64") == len(mixed.plots) + len(figures)

    only_plain = write_report([plain("dynamic"), plain("static")], tmp_path / "plain", ReportContext("p", Settings()))
    assert only_plain.workloads is None
    assert workload_section([plain("dynamic")], tmp_path / "unused") is None
    assert not (tmp_path / "unused").exists()
    for name in ("report.html", "selection.md"):
        text = (tmp_path / "plain" / name).read_text()
        assert "Workloads" not in text and "workload" not in text
    assert not list((tmp_path / "plain" / "plots").glob("workload_*"))


def served(records, call_ms, rows=1):
    """`records` as `generate` served them: `rows` consecutive requests a call, each call taking `call_ms`."""
    for i, record in enumerate(records):
        record["call"], record["service_ms"] = i // rows, call_ms
    return records


def test_compile_payback_is_compile_seconds_over_the_per_call_saving_in_server_seconds():
    """Compiling took 0.5 s; the compiled static cache serves each request in 60 ms of the server's time against
    dynamic's 100: 0.5 / 0.04 = 12.5, so the 13th request repays it. The mix has 4 requests, so the saving goes on
    at its mean past them. Its end-to-end times (1 s, queued behind open-loop arrivals) are not the server's work:
    they do not count. Slower than dynamic: never."""
    dynamic = workload("dynamic", reqs=served(requests([100.0] * 4, [10.0] * 4), 100.0))
    faster = workload(
        "static", compile=True, metrics={"compile_s": 0.5}, reqs=served(requests([1000.0] * 4, [5.0] * 4), 60.0)
    )
    slower = workload(
        "static", compile=True, metrics={"compile_s": 0.5}, reqs=served(requests([60.0] * 4, [5.0] * 4), 120.0)
    )
    assert payback_text(faster, [dynamic, faster]) == "13 requests"
    assert payback_text(slower, [dynamic, slower]) == "never"
    assert payback_text(dynamic, [dynamic, faster]) == "-"
    assert payback_text(faster, [faster]) == "no dynamic cell"
    # within the mix: savings 40, 40, 40, 40 ms against 0.1 s of compiling: the 3rd request (120 ms) repays it
    quick = workload(
        "static", compile=True, metrics={"compile_s": 0.1}, reqs=served(requests([60.0] * 4, [5.0] * 4), 60.0)
    )
    assert payback_text(quick, [dynamic, quick]) == "3 requests"


def test_a_batched_call_saves_once_however_many_rows_it_serves():
    """Batches of 2: each call takes dynamic 100 ms and compiled 60 ms, a saving of 40 ms a call, not 40 ms a row.
    0.07 s of compiling: the first call saves 40 ms, the second 80 in all: repaid with the second call's rows, the
    4th request (counted per row, 40 ms each, it would have been the 2nd). 0.1 s: past the mix's 80 ms, at its mean
    per request (80 ms over 4 requests, 20 ms): 0.1 / 0.02 = 5 requests."""
    dynamic = workload("dynamic", reqs=served(requests([100.0] * 4, [10.0] * 4), 100.0, rows=2))
    compiled = {
        compile_s: workload(
            "static",
            compile=True,
            metrics={"compile_s": compile_s},
            reqs=served(requests([60.0] * 4, [5.0] * 4), 60.0, rows=2),
        )
        for compile_s in (0.07, 0.1)
    }
    assert payback_text(compiled[0.07], [dynamic, compiled[0.07]]) == "4 requests"
    assert payback_text(compiled[0.1], [dynamic, compiled[0.1]]) == "5 requests"
    alone = workload("dynamic", reqs=served(requests([100.0] * 4, [10.0] * 4), 100.0))  # one request a call
    assert payback_text(compiled[0.1], [alone, compiled[0.1]]) == "the cells' calls differ"


def test_samples_without_call_times_cannot_tell_a_payback():
    """Records written before requests carried their call and its time: the report says it cannot tell."""
    dynamic = workload("dynamic", reqs=requests([100.0] * 4, [10.0] * 4))
    compiled = workload(
        "static", compile=True, metrics={"compile_s": 0.1}, reqs=served(requests([60.0] * 4, [5.0] * 4), 60.0)
    )
    assert payback_text(compiled, [dynamic, compiled]) == "needs both cells' call times (older samples lack them)"
    assert payback_findings([[dynamic, compiled]]) == ({}, {})  # nothing logged that it could not tell


def test_a_request_record_carries_the_fields_the_payback_reads():
    record = asdict(RequestTimes(8, 2, None, 1.0, 1.0, 2.0, 0.0, (1, 2), 0, 3.0))
    assert record[CALL] == 0 and record[SERVICE_MS] == 3.0


def with_tokens(cache, tokens, **kw):
    reqs = requests([50.0] * len(tokens), [5.0] * len(tokens))
    for record, t in zip(reqs, tokens, strict=True):
        record["tokens"] = t
    return workload(cache, reqs=reqs, **kw)


def test_a_workload_caches_tokens_are_compared_with_dynamics_request_by_request():
    """Two requests of 4 and 3 tokens: fp8 differs at the second request's position 1 and after (2 of 7
    positions), paged nowhere; the earliest divergence over the mix is position 1."""
    dynamic = with_tokens("dynamic", [[5, 6, 7, 8], [1, 2, 3]])
    fp8 = with_tokens("quantized-fp8", [[5, 6, 7, 8], [1, 9, 9]])
    paged = with_tokens("paged", [[5, 6, 7, 8], [1, 2, 3]])
    other_mix = with_tokens("quantized-fp8", [[0, 0, 0, 0], [0, 0, 0]], mix="rag")  # no dynamic cell of its own
    fill_agreement([dynamic, fp8, paged, other_mix])
    assert fp8.metrics["token_agreement"] == pytest.approx(5 / 7) and fp8.metrics["first_divergence"] == 1
    assert paged.metrics["token_agreement"] == 1.0 and paged.metrics["first_divergence"] == 4
    assert dynamic.metrics["token_agreement"] == 1.0
    assert "token_agreement" not in other_mix.metrics


# Answer accuracies of 40 prompts with their Clopper-Pearson 95% intervals (worked out with scipy.stats.beta)
ACCURACY_38_OF_40 = (0.95, 0.8308, 0.9939)
ACCURACY_12_OF_40 = (0.30, 0.1656, 0.4653)


def answered(accuracy):
    value, low, high = accuracy
    return {
        "answer_accuracy": value,
        "answer_accuracy_ci_low": low,
        "answer_accuracy_ci_high": high,
        "task_trials": 40.0,
        "tpot_ms_p90": 10.0,
    }


def test_a_continuous_group_is_judged_by_the_mixs_dynamic_answers_from_another_serving_mode():
    """Continuous serving runs only paged, so its group has no dynamic cell; the mix's sequential dynamic cell
    answered the same prompts (greedy answers do not depend on how requests were served) and judges it."""
    from kvsweep.report.selection import decide

    results = [
        workload("dynamic", serving="sequential", batch=1, metrics=answered(ACCURACY_38_OF_40)),
        workload("paged", serving="sequential", batch=1, metrics=answered(ACCURACY_38_OF_40)),
        workload("paged", metrics=answered(ACCURACY_12_OF_40)),  # continuous, B=4: far below dynamic's 0.95 [0.83-0.99]
    ]
    by_serving = {d.key[7]: d for d in decide(results, Settings())}
    continuous = by_serving["continuous"].entries[0]
    assert continuous.gate.refused and "answers 0.30" in continuous.gate.refusals[0]
    assert by_serving["continuous"].pick is None  # its only cache lost the task: nothing to recommend
    assert not by_serving["sequential"].entries[1].gate.refused  # paged at dynamic's accuracy is kept
    assert continuous.deltas == {}  # served otherwise: its timings are not compared with the sequential dynamic
