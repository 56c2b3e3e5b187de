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
        for r in requests:  # a request's first token comes before its last, the decode gaps in between
            assert 0 < r["ttft_ms"] <= r["e2e_ms"]
            assert r["e2e_ms"] == pytest.approx(r["ttft_ms"] + (r["output_tokens"] - 1) * r["tpot_ms"], rel=1e-6)
        e2e = sorted(r["e2e_ms"] for r in requests)
        assert m[Metric.E2E_MS_P50] == pytest.approx((e2e[2] + e2e[3]) / 2)  # 6 values: between the 3rd and 4th
        assert m[Metric.GOODPUT_REQUESTS_PER_S] == pytest.approx(m[Metric.REQUESTS_PER_S])
        assert m[Metric.OUTPUT_TOKENS_PER_S] == pytest.approx(m[Metric.REQUESTS_PER_S] * (8 + 16) / 2)
        assert ci_low(Metric.E2E_MS_P99) not in m  # 6 requests: no order statistics bound a p99 at 95%
        assert ci_high(Metric.E2E_MS_P50) in m  # ... but they bound the median: x(1) and x(6), 97% coverage
    # static sized for the longest request, 200 + 16 - 1 = 215 token slots a row. Sequential: each request holds
    # 215 and fills 71 or 215: 1 - 3 x (71 + 215) / (6 x 215). Batched in pairs (64, 200): the short row is padded
    # to 200, so it fills 200 + 8 - 1 = 207: 1 - 3 x (207 + 215) / (6 x 215).
    static_seq, static_batched = results[("static", "sequential")], results[("static", "batched")]
    assert static_seq.metrics[Metric.STATIC_UNUSED_SHARE] == pytest.approx(1 - 3 * (71 + 215) / (6 * 215))
    assert static_batched.metrics[Metric.STATIC_UNUSED_SHARE] == pytest.approx(1 - 3 * (207 + 215) / (6 * 215))
    assert Metric.STATIC_UNUSED_SHARE not in results[("dynamic", "sequential")].metrics
    # batched: each pair pads 64 up to 200: 136 of 400 prompt positions
    assert results[("dynamic", "batched")].metrics[Metric.PADDING_SHARE] == pytest.approx(136 / 400)
    assert Metric.PADDING_SHARE not in results[("dynamic", "sequential")].metrics
    # MLflow: a workload cell's coordinates are params; a fixed-shape sweep's runs do not get them
    _, children = cell_runs(store)
    params = {(c.data.params["cache"], c.data.params["serving"]): c.data.params for c in children}
    assert params[("paged", "batched")]["workload"] == "chat"
    assert "chat" in out and "sequential bs1 (p90 over requests)" in out
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
    nothing more, and the report's payback is compile seconds over the mean per-request saving against dynamic,
    worked out here from the two cells' request times."""
    mix = ['workload.input_lengths="fixed:32,64"', 'workload.output_lengths="fixed:8"', "workload.requests=6"]
    code, out, run_dir = sweep(tmp_path, store, *mix, "grid.caches=[dynamic,static]", "grid.compile=[false,true]")
    assert code == 0, out
    cells = {(r.cell.cache, r.cell.compile): r for r in Journal(run_dir).read().results}
    compiled, dynamic = cells[("static", True)], cells[("dynamic", False)]
    assert compiled.metrics[Metric.RECOMPILES] >= 2  # a graph for each prompt length at least
    assert compiled.metrics[Metric.COMPILE_RECAPTURES] == 0  # the measured replay found every graph compiled
    assert compiled.metrics[Metric.COMPILE_S] > 0
    pairs = zip(compiled.samples["requests"], dynamic.samples["requests"], strict=True)  # the same requests
    saving = [d["e2e_ms"] - c["e2e_ms"] for c, d in pairs]
    mean_s = sum(saving) / len(saving) / 1e3
    selection = (run_dir / "report" / "selection.md").read_text()
    row = next(line for line in selection.splitlines() if line.startswith("| [static+compile]"))
    # MLflow: the compiled cell's run carries the payback (a number of requests, or the tag alone saying never)
    _, children = cell_runs(store)
    run = next(c for c in children if c.data.params["compile"] == "true" and c.data.params["cache"] == "static")
    if mean_s <= 0:
        assert row.endswith("| never |")
        assert run.data.tags["kvsweep.compile_payback"] == "never"
        assert Metric.COMPILE_PAYBACK_REQUESTS not in run.data.metrics
    else:  # the mix is 6 requests: far fewer than a compile of seconds needs at a saving of milliseconds
        expected = -(-compiled.metrics[Metric.COMPILE_S] // mean_s)
        assert row.endswith(f"| {int(expected)} requests |"), (row, expected)
        assert run.data.metrics[Metric.COMPILE_PAYBACK_REQUESTS] == expected
        assert run.data.tags["kvsweep.compile_payback"] == f"{int(expected)} requests"
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
    # the reservation's unused share: 2 rows x 159 reserved; row 1 fills 100 + 4 - 1, row 2 (padded to 100) 100 + 60 - 1
    assert result["metrics"][Metric.STATIC_UNUSED_SHARE] == pytest.approx(1 - (103 + 159) / (2 * 159))
