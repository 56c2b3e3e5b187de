"""The capacity search through `python -m kvsweep` on CPU, checked by hand.

A small random-weight Llama whose KV cache dominates its memory (16 layers of 2 x 64-wide K/V heads on a
32-wide model): under `measure.device_memory_limit_gb` its cells really fail in the allocator when they
do not fit. Each frontier the search reports is checked apart from the search: the found batch runs and
the next one does not in a plain grid sweep; an SLO frontier's two probes are judged again from their raw
samples; an interrupted search resumes without measuring a finished probe again.
"""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, cell_runs, statuses
from kvsweep.results import OK, OOM, CellResult
from kvsweep.tracking.journal import Journal
from kvsweep_testkit.kv_heavy import save_kv_heavy

# 16 layers x 2 (K, V) x 2 heads x 64 x 4 bytes = 16 KiB a token: 8.1 MiB a row at 512 + 7 tokens, so a
# limit of 0.1 GB holds a handful of rows.
LIMITED = ["grid.context_lengths=[512]", "grid.max_new_tokens=[8]", "measure.device_memory_limit_gb=0.1"]
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def kv_heavy(tmp_path_factory) -> Path:
    return save_kv_heavy(tmp_path_factory.mktemp("models") / "kv-heavy")


def capacity_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "capacity.csv").open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_a_memory_frontier_is_the_largest_batch_that_runs_and_a_quantized_cache_holds_at_least_as_many(
    run_sweep, kv_heavy
):
    caches = "grid.caches=[dynamic,quantized-hqq-int4]"
    # A lower limit: dynamic holds about 3 rows. The search stops at 5, above that: each HQQ row costs seconds.
    limited = [*LIMITED[:-1], "measure.device_memory_limit_gb=0.07"]
    run = run_sweep(f"grid.models=[{kv_heavy}]", *limited, caches, "search.batch=true", "search.max_batch=5")
    assert run.code == 0, run.out + run.err
    rows = {row["cache"]: row for row in capacity_rows(run.run_dir)}
    dynamic, hqq = int(rows["dynamic"]["max_batch"]), int(rows["quantized-hqq-int4"]["max_batch"])
    assert rows["dynamic"]["limit"] == "memory" and 1 <= dynamic < 5, rows["dynamic"]
    assert hqq >= dynamic  # it stores an eighth of the keys and values
    assert rows["quantized-hqq-int4"]["limit"] in ("memory", "search.max_batch"), rows["quantized-hqq-int4"]
    assert int(rows["dynamic"]["probes"]) >= 2 and rows["dynamic"]["predicted_max_batch"]  # the planner's, beside it
    assert "most capacity at ctx 512 (no SLO: memory only): " in run.out

    # MLflow: the frontier's probe is tagged; the parent holds capacity.csv.
    parents, children = cell_runs(run.tracking_uri)
    frontier = {
        (c.data.params["cache"], c.data.params["batch_size"]) for c in children if "kvsweep.frontier" in c.data.tags
    }
    assert frontier == {("dynamic", str(dynamic)), ("quantized-hqq-int4", str(hqq))}
    assert {c.data.tags["kvsweep.search"] for c in children} == {"batch"}
    from mlflow import MlflowClient

    artifacts = [a.path for a in MlflowClient(run.tracking_uri).list_artifacts(parents[0].info.run_id)]
    assert "capacity.csv" in artifacts

    # By hand, in a plain grid with the same limit: the found batch runs, the next one up does not.
    by_hand = run_sweep(
        f"grid.models=[{kv_heavy}]",
        *limited,
        "grid.caches=[dynamic]",
        f"grid.batch_sizes=[{dynamic},{dynamic + 1}]",
        "infer_oom=false",
        experiment="by-hand",
    )
    found = statuses(by_hand.tracking_uri, "batch_size", experiment="by-hand")
    assert found == {str(dynamic): OK, str(dynamic + 1): OOM}, found


def tpot_upper_end(result: CellResult) -> float:
    """The upper end of the median TPOT's interval, from the raw gaps: below 6 calls it is the largest."""
    per_call = [sum(call["gaps_ms"]) / len(call["gaps_ms"]) for call in result.samples["repeats"]]
    assert len(per_call) < 6
    return max(per_call)


@pytest.mark.slow
def test_an_slo_frontier_stops_where_the_intervals_say(run_sweep):
    base = ["grid.context_lengths=[512]", "grid.caches=[dynamic]", "grid.max_new_tokens=[8]", "measure.repeats=3"]
    reference = run_sweep(*base, "grid.batch_sizes=[1,16]", experiment="reference")
    by_batch = {r.cell.batch_size: r for r in Journal(reference.run_dir).read().results}
    slo = (tpot_upper_end(by_batch[1]) + tpot_upper_end(by_batch[16])) / 2  # between batch 1's and 16's

    run = run_sweep(*base, "search.batch=true", "search.max_batch=16", f"slo.tpot_ms={slo}")
    assert run.code == 0, run.out + run.err
    [row] = capacity_rows(run.run_dir)
    probes = {r.cell.batch_size: r for r in Journal(run.run_dir).read().results}
    best = int(row["max_batch"])
    assert row["limit"] in ("slo_tpot", "search.max_batch"), row
    if best:
        assert probes[best].status == OK and tpot_upper_end(probes[best]) <= slo
    if row["limit"] == "slo_tpot":  # the probe above it was measured and its upper end is over the SLO
        assert tpot_upper_end(probes[best + 1]) > slo
    else:
        assert best == 16
    assert f"within tpot <= {slo:g} ms" in run.out


def _results(run_dir: Path) -> list[CellResult]:
    return Journal(run_dir).read().results


@pytest.mark.heavy  # multi-process reliability: SIGINT, then the same command again
def test_an_interrupted_search_resumes_without_measuring_a_finished_probe_again(tmp_path, kv_heavy):
    command = [
        sys.executable,
        "-m",
        "kvsweep",
        *FAST,
        f"grid.models=[{kv_heavy}]",
        *LIMITED,
        "grid.caches=[dynamic]",
        "search.batch=true",
        "search.max_batch=32",
        f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
    ]
    env = {**os.environ, **QUIET}
    first = subprocess.Popen(
        [*command, f"hydra.run.dir={tmp_path}/a"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while len(_results(tmp_path / "a")) < 2:  # two probes in: the search is under way, not finished
        assert first.poll() is None, first.communicate()[0]
        assert time.monotonic() < deadline, "the search never measured two probes"
        time.sleep(0.3)
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130, first.communicate()[0]
    before = {r.cell_id for r in _results(tmp_path / "a")}

    rerun = subprocess.run(
        [*command, f"hydra.run.dir={tmp_path}/b"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"resuming: {len(before)} probes already have results" in rerun.stdout
    after = _results(tmp_path / "b")
    assert not before & {r.cell_id for r in after}  # nothing finished was measured again
    [row] = capacity_rows(tmp_path / "b")
    both = {r.cell.batch_size: r.status for r in [*_results(tmp_path / "a"), *after]}
    best = int(row["max_batch"])
    assert row["limit"] == "memory" and both[best] == OK and both[best + 1] == OOM, (row, both)
    _, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    ids = [c.data.tags["kvsweep.cell_id"] for c in children]
    assert len(ids) == len(set(ids)) == len(both)  # one child run per probe, the interrupted one reused


@pytest.mark.slow
def test_a_context_frontier_is_the_longest_context_that_runs_in_steps_of_the_context_step(run_sweep, kv_heavy):
    fixed = [f"grid.models=[{kv_heavy}]", "grid.batch_sizes=[4]", "grid.max_new_tokens=[8]", "grid.caches=[dynamic]"]
    limit = "measure.device_memory_limit_gb=0.1"
    search = ["search.contexts=true", "search.context_step=128", "search.max_context=2048"]
    run = run_sweep(*fixed, limit, *search)
    assert run.code == 0, run.out + run.err
    [row] = capacity_rows(run.run_dir)
    longest = int(row["max_context"])
    assert (row["axis"], row["batch_size"], row["limit"]) == ("context", "4", "memory"), row
    assert longest % 128 == 0 and 128 <= longest < 2048
    assert "longest context at batch 4" in run.out

    by_hand = run_sweep(*fixed, limit, f"grid.context_lengths=[{longest},{longest + 128}]", experiment="by-hand")
    found = statuses(by_hand.tracking_uri, "context_length", experiment="by-hand")
    assert found == {str(longest): OK, str(longest + 128): OOM}, found
