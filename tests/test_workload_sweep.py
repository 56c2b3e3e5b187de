"""Workloads as a user runs them: `python -m kvsweep workload.source=...`, through Ray and MLflow.

Every expectation is worked out here from the mix the test wrote (its lengths, its order), not from kvsweep's
output: the static reservation's unused share, the padding of a batch, the request counts, and each request's
times against each other.
"""

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from conftest import cell_runs
from kvsweep.cli import main
from kvsweep.names import Metric, ci_high, ci_low
from kvsweep.tracking.journal import Journal

# Two prompt lengths and two output lengths, cycled: (64, 8), (200, 16), (64, 8), ... over 6 requests
MIX = ['workload.input_lengths="fixed:64,200"', 'workload.output_lengths="fixed:8,16"', "workload.requests=6"]
BASE = ["grid.models=[tiny-llama]", "grid.dtypes=[float32]", "measure.threads=1", "workload.warmup_requests=1"]


def kvsweep(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def store(migrated_store, tmp_path) -> str:
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def sweep(tmp_path: Path, store: str, *overrides: str, run: str = "run") -> tuple[int, str, Path]:
    run_dir = tmp_path / run
    code, out, err = kvsweep(
        *BASE, *overrides, f"mlflow.tracking_uri={store}", f"hydra.run.dir={run_dir}", "workload.source=lengths"
    )
    return code, out + err, run_dir


@pytest.mark.slow
def test_a_mix_through_three_caches_and_two_serving_modes(ray_cluster, cell_template, store, tmp_path):
    code, out, run_dir = sweep(
        tmp_path,
        store,
        *MIX,
        "workload.name=chat",
        "workload.serving=[sequential,batched]",
        "grid.caches=[dynamic,static,paged]",
        "grid.batch_sizes=[2]",
        "slo.ttft_ms=1000000",  # every request meets it: goodput is the request rate
    )
    assert code == 0, out
    results = {(r.cell.cache, r.cell.serving): r for r in Journal(run_dir).read().results}
    assert set(results) == {(c, s) for c in ("dynamic", "static", "paged") for s in ("sequential", "batched")}
    lengths = [(64, 8), (200, 16)] * 3
    for (cache, serving), result in results.items():
        assert result.status == "ok", (cache, serving, result.error)
        m, requests = result.metrics, result.samples["requests"]
        assert [(r["input_tokens"], r["output_tokens"]) for r in requests] == lengths  # every request, in order
        assert result.cell.batch_size == (1 if serving == "sequential" else 2)  # sequential is one at a time
        assert result.cell.context_length == 200 and result.cell.max_new_tokens == 16  # the longest request
        for r in requests:  # every output token generated and stamped; the first before the last (8 or 16 of them)
            assert len(r["tokens"]) == r["output_tokens"]
            assert 0 < r["ttft_ms"] < r["e2e_ms"] and r["queue_ms"] == 0.0  # closed loop: sent on arrival
        e2e = sorted(r["e2e_ms"] for r in requests)
        assert m[Metric.E2E_MS_P50] == pytest.approx((e2e[2] + e2e[3]) / 2)  # 6 values: between the 3rd and 4th
        assert m[Metric.GOODPUT_REQUESTS_PER_S] == pytest.approx(m[Metric.REQUESTS_PER_S])
        # Closed loop, one call (sequential) or one batch of 2 at a time: the replay's span holds each call's
        # longest request end to end, one after another, and little else between them. So the 72 tokens of the mix
        # (3 x (8 + 16)) over the span are at most 72 over those calls' time, and not far below it.
        rows = result.cell.batch_size
        busy_s = sum(max(r["e2e_ms"] for r in requests[i : i + rows]) for i in range(0, 6, rows)) / 1e3
        assert 0.5 * 72 / busy_s < m[Metric.OUTPUT_TOKENS_PER_S] <= 72 / busy_s
        if cache != "paged":  # through generate: a call's rows share it and its time, which holds their own
            assert [r["call"] for r in requests] == [i // rows for i in range(6)]
            assert all(r["service_ms"] >= r["e2e_ms"] for r in requests)
        if cache != "paged" and serving == "batched":  # both rows' first token is the call's; the 8-token row ends
            for short, long in (requests[i : i + 2] for i in range(0, 6, 2)):  # at the 16-token row's 8th
                assert short["ttft_ms"] == long["ttft_ms"] and short["e2e_ms"] < long["e2e_ms"]
        assert ci_low(Metric.E2E_MS_P99) not in m  # 6 requests: no order statistics bound a p99 at 95%
        assert ci_high(Metric.E2E_MS_P50) in m  # ... but they bound the median: x(1) and x(6), 97% coverage
    # static sized for the longest request, 200 + 16 - 1 = 215 token slots a row. Sequential: each request holds
    # 215 and fills 71 or 215: 1 - 3 x (71 + 215) / (6 x 215). Batched in pairs (64, 200): generate pads the short
    # row to 200 and runs it to the pair's 16 tokens, so it fills 200 + 16 - 1 = 215 too: nothing unused.
    static_seq, static_batched = results[("static", "sequential")], results[("static", "batched")]
    assert static_seq.metrics[Metric.STATIC_UNUSED_SHARE] == pytest.approx(1 - 3 * (71 + 215) / (6 * 215))
    assert static_batched.metrics[Metric.STATIC_UNUSED_SHARE] == pytest.approx(0.0)
    assert Metric.STATIC_UNUSED_SHARE not in results[("dynamic", "sequential")].metrics
    # batched: each pair pads 64 up to 200: 136 of 400 prompt positions; and generates 16 + 16 tokens, 8 of them
    # past the short row's own output
    for cache in ("dynamic", "static"):
        assert results[(cache, "batched")].metrics[Metric.PADDING_SHARE] == pytest.approx(136 / 400)
        assert results[(cache, "batched")].metrics[Metric.OVERGENERATION_SHARE] == pytest.approx(8 / 32)
    for metric in (Metric.PADDING_SHARE, Metric.OVERGENERATION_SHARE):  # continuous batching stops each at its own
        assert metric not in results[("dynamic", "sequential")].metrics
        assert metric not in results[("paged", "batched")].metrics
    # MLflow: a workload cell's coordinates are params; a fixed-shape sweep's runs do not get them
    _, children = cell_runs(store)
    params = {(c.data.params["cache"], c.data.params["serving"]): c.data.params for c in children}
    assert params[("paged", "batched")]["workload"] == "chat"
    # 6 requests bracket a median but no p90: the selection ranks by p50 and says why
    assert "chat" in out and "sequential bs1 (tpot p50 over requests)" in out
    assert "ranked by p50: 6 requests give no p90 interval (29 do)" in out
    assert (run_dir / "report" / "plots" / "workload_tiny-llama_float32_chat_batched_bs2.png").is_file()


@pytest.mark.slow
def test_an_interrupted_workload_sweep_resumes_without_measuring_again(ray_cluster, cell_template, store, tmp_path):
    broken = "+testing.faults=[{match: {cache: paged}, fault: error}]"  # the paged cell fails the first time
    first, out, _ = sweep(tmp_path, store, *MIX, "grid.caches=[dynamic,paged]", broken)
    assert first == 1, out
    again, out, run_dir = sweep(tmp_path, store, *MIX, "grid.caches=[dynamic,paged]", run="again")
    assert again == 0, out
    assert "resuming: 1 of 2 cells" in out
    assert "forecast refined for the remaining cells: 1 finished cells took" in out  # read back from MLflow
    measured = [r.cell.cache for r in Journal(run_dir).read().results]
    assert measured == ["paged"]  # dynamic's workload cell came from the first run, not measured again
    _, children = cell_runs(store)
    assert sorted(c.data.params["cache"] for c in children) == ["dynamic", "paged"]  # one run each


def trace(tmp_path: Path, *lines: dict | str) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (({"input_tokens": 10, "output_tokens": 4}, {"output_tokens": 4}), "line 2: no input_tokens"),
        (({"input_tokens": -3, "output_tokens": 4},), "line 1: input_tokens must be a positive integer, got -3"),
        (({"input_tokens": 10, "output_tokens": 4}, "{not json"), "line 2: not JSON"),
    ],
)
def test_a_bad_trace_is_one_line_and_exit_2_before_anything_starts(lines, says, tmp_path):
    path = trace(tmp_path, *lines)
    code, _, err = kvsweep("workload.source=trace", f"workload.path={path}", f"hydra.run.dir={tmp_path}/run")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and path in err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_trace_request_past_the_models_positions_is_refused(tmp_path):
    """tiny-llama has 4,096 positions: 4,000 + 100 do not fit, and a trace's request is the user's, never cut."""
    path = trace(tmp_path, {"input_tokens": 10, "output_tokens": 4}, {"input_tokens": 4000, "output_tokens": 100})
    code, _, err = kvsweep(
        "workload.source=trace", f"workload.path={path}", "dry_run=true", f"hydra.run.dir={tmp_path}/run"
    )
    assert code == 2
    assert "request 2" in err and "4100" in err and "4096 positions" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["workload.source=lengths", *MIX, "grid.context_lengths=[512]"], "grid.context_lengths is set but"),
        (["workload.source=lengths", "workload.requests=4"], "needs workload.input_lengths"),
        (["workload.source=lengths", *MIX, "workload.serving=[streaming]"], "unknown mode 'streaming'"),
        (["workload.source=lengths", *MIX[1:], 'workload.input_lengths="uniform:9-3"'], "workload.input_lengths"),
        (["workload.source=replay"], "unknown source 'replay'"),
    ],
)
def test_a_bad_workload_is_one_line_and_exit_2(overrides, says, tmp_path):
    code, _, err = kvsweep(*overrides, f"hydra.run.dir={tmp_path}/run")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.slow
def test_a_compiled_static_cache_over_a_mix_counts_its_compiles_and_when_they_pay_back(
    ray_cluster, cell_template, store, tmp_path
):
    """Two prompt lengths: the cold replay compiles at least once per length, the measured replay compiles
    nothing more, and the report's payback is in the server's seconds: worked out here by its definition, request
    after request (the mix's own savings, then its mean saving on and on), from the two cells' call times. What
    that counts is checked against stand-in servers of known times in test_workload_replay.py."""
    mix = ['workload.input_lengths="fixed:32,64"', 'workload.output_lengths="fixed:8"', "workload.requests=6"]
    code, out, run_dir = sweep(tmp_path, store, *mix, "grid.caches=[dynamic,static]", "grid.compile=[false,true]")
    assert code == 0, out
    cells = {(r.cell.cache, r.cell.compile): r for r in Journal(run_dir).read().results}
    compiled, dynamic = cells[("static", True)], cells[("dynamic", False)]
    assert compiled.metrics[Metric.RECOMPILES] >= 2  # a graph for each prompt length at least
    assert compiled.metrics[Metric.COMPILE_RECAPTURES] == 0  # the measured replay found every graph compiled
    compile_s = compiled.metrics[Metric.COMPILE_S]
    assert compile_s > 0.1  # Dynamo tracing and Inductor compiling two graphs take far longer than this
    pairs = list(zip(compiled.samples["requests"], dynamic.samples["requests"], strict=True))  # the same requests
    assert [(c["call"], d["call"]) for c, d in pairs] == [(i, i) for i in range(6)]  # sequential: a call each
    for record in (r for pair in pairs for r in pair):  # a call's time holds its request, closed loop
        assert record["service_ms"] >= record["e2e_ms"] > 0
    saving_s = [(d["service_ms"] - c["service_ms"]) / 1e3 for c, d in pairs]
    mean_s = sum(saving_s) / len(saving_s)
    expected, repaid = 0, 0.0
    while mean_s > 0 and repaid < compile_s and expected < 10**7:  # a request more until the savings repay compiling
        repaid += saving_s[expected] if expected < len(saving_s) else mean_s
        expected += 1
    selection = (run_dir / "report" / "selection.md").read_text()
    row = next(line for line in selection.splitlines() if line.startswith("| [static+compile]"))
    # MLflow: the compiled cell's run carries the payback (a number of requests, or the tag alone saying never)
    _, children = cell_runs(store)
    run = next(c for c in children if c.data.params["compile"] == "true" and c.data.params["cache"] == "static")
    if mean_s <= 0:
        assert row.endswith("| never |")
        assert run.data.tags["kvsweep.compile_payback"] == "never"
        assert Metric.COMPILE_PAYBACK_REQUESTS not in run.data.metrics
    else:
        found = run.data.metrics[Metric.COMPILE_PAYBACK_REQUESTS]
        assert abs(found - expected) <= 1, (found, expected)  # a float sum's rounding at the last request
        assert row.endswith(f"| {int(found)} requests |"), row
        assert run.data.tags["kvsweep.compile_payback"] == f"{int(found)} requests"
    # ...and every cell that is not dynamic its token agreement with dynamic's answers to the same requests
    agreement = {(c.data.params["cache"], c.data.params["compile"]): c.data.metrics for c in children}
    assert Metric.TOKEN_AGREEMENT in agreement[("static", "false")] and Metric.TOKEN_AGREEMENT in run.data.metrics


def test_a_static_batch_is_sized_for_its_longest_prompt_and_longest_output_together():
    """(100 in, 4 out) and (8 in, 60 out) in one batch of 2: generate pads both rows to 100 and runs both to 60
    new tokens, so the batch needs 100 + 60 - 1 = 159 positions, more than either request (103, 67). The cell
    plans that, and its static cache reserves it for every batch, so the run matches what it planned."""
    from dataclasses import replace

    from kvsweep.grid import MeasureProtocol
    from kvsweep.plan.workload_cells import workload_cells
    from kvsweep.workload.request_mix import Request, RequestMix
    from kvsweep.workload.workload_spec import WorkloadSpec
    from kvsweep_testkit.cells import measure_cell

    mix = RequestMix("two", (Request(100, 4), Request(8, 60)))
    spec = WorkloadSpec("two", mix, 0, "lengths")
    grid = {"models": ["tiny-llama"], "dtypes": ["float32"], "batch_sizes": [2], "caches": ["static"], "compile": [0]}
    batched, sequential = (
        workload_cells(grid, [mode], spec, {"tiny-llama": 4096})[0] for mode in ("batched", "sequential")
    )
    assert (batched.context_length, batched.max_new_tokens, batched.cached_tokens) == (100, 60, 159)
    assert (sequential.context_length, sequential.max_new_tokens, sequential.cached_tokens) == (100, 4, 103)
    protocol = replace(MeasureProtocol.exact(0, 1, 0, "cpu", 1), workload=spec)
    result = measure_cell(batched.to_dict(), protocol.to_dict())
    assert result["status"] == "ok", result["error"]
    # the reservation's unused share: 2 rows x 159 reserved; generate pads row 2 to 100 and runs row 1 to 60 new
    # tokens with it, so each writes 100 + 60 - 1 = 159 slots (row 1's own output would be 103): nothing unused
    assert result["metrics"][Metric.STATIC_UNUSED_SHARE] == pytest.approx(0.0)
    # ...and of the 2 x 60 tokens generated, 56 are past row 1's own 4
    assert result["metrics"][Metric.OVERGENERATION_SHARE] == pytest.approx(56 / 120)


def test_paged_batched_serving_holds_each_batch_in_flight_and_times_every_token():
    """(100 in, 4 out) and (8 in, 60 out), twice, in batches of 2 through continuous batching: each request's
    103 or 67 cached tokens fit one 256-token page, and both of a batch are in flight at once: 2 pages at the
    fullest (one at a time would be 1). Every request gets its own output, each token stamped; the 4-token request
    of a batch ends first, and the next batch goes only once both are done, so the span holds each batch's longest
    request one after the other. Continuous batching pads nothing and stops each request at its own output."""
    from dataclasses import replace

    from kvsweep.grid import MeasureProtocol
    from kvsweep.plan.workload_cells import workload_cells
    from kvsweep.workload.request_mix import Request, RequestMix
    from kvsweep.workload.workload_spec import WorkloadSpec
    from kvsweep_testkit.cells import measure_cell

    mix = RequestMix("two", (Request(100, 4), Request(8, 60)) * 2)
    spec = WorkloadSpec("two", mix, 0, "lengths")
    grid = {"models": ["tiny-llama"], "dtypes": ["float32"], "batch_sizes": [2], "caches": ["paged"], "compile": [0]}
    [cell] = workload_cells(grid, ["batched"], spec, {"tiny-llama": 4096})
    protocol = replace(MeasureProtocol.exact(0, 1, 0, "cpu", 1), workload=spec)
    result = measure_cell(cell.to_dict(), protocol.to_dict())
    assert result["status"] == "ok", result["error"]
    metrics, requests = result["metrics"], result["samples"]["requests"]
    assert [(r["output_tokens"], len(r["tokens"])) for r in requests] == [(4, 4), (60, 60)] * 2
    assert all(r["call"] is None and r["service_ms"] is None for r in requests)  # no generate calls to time
    assert metrics[Metric.KV_PAGES_PEAK] == 2
    for short, long in (requests[0:2], requests[2:4]):
        assert short["queue_ms"] == long["queue_ms"] == 0.0  # closed loop: each batch sent whole
        assert 0 < short["ttft_ms"] < short["e2e_ms"] < long["e2e_ms"]
    span_s = 4 / metrics[Metric.REQUESTS_PER_S]
    assert span_s >= (requests[1]["e2e_ms"] + requests[3]["e2e_ms"]) / 1e3
    for metric in (Metric.PADDING_SHARE, Metric.OVERGENERATION_SHARE, Metric.STATIC_UNUSED_SHARE):
        assert metric not in metrics
