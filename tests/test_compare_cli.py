"""`python -m kvsweep compare` on real sweeps in a real MLflow store.

Sweep D (a cell no other sweep has), A (dynamic and static at batch 1 and 2), A again (`rerun=true`:
identical), B (A plus a longer context, its static cells slowed through the `slow` fault, dynamic at
batch 2 made to OOM), C (one of A's cells measured beside a burner on a core it uses, every call kept:
contended).

A, its rerun and B sleep SLEEP_MS for every token of every cell (the first token too). A 2-core CI
host shared with other guests has run one sweep's tiny-model decode at twice another's speed, and its
8 ms prefill at 2.5 times, with the guard off (as here); such drift between two runs is what
`--threshold` is for, and on a quiet machine it stays within the default (BENCHMARKS.md,
compare_noise). Tokens made mostly of a sleep, compared at THRESHOLD, keep these tests about compare's
matching and verdicts, not about the host's weather: 2.5 times the compute moves a token's time by a
factor under 1 + THRESHOLD, while the slowed cells' added DELAY_MS moves it well beyond.
Every expected verdict is worked out from what the faults did and from A's own numbers in MLflow.
"""

import csv
import io
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from mlflow import MlflowClient

from conftest import burner_on, sweep_in_process
from kvsweep.cli import main

DELAY_MS = 30.0
THRESHOLD = "1"  # timings: B/A beyond 2 or below 0.5
NEW_TOKENS = 8
GRID = ("grid.context_lengths=[64]", "grid.batch_sizes=[1,2]", "grid.caches=[dynamic,static]")
# The contention guard off: on a shared CI host any cell may read as contended and lose its verdict,
# which would hide what these tests look for (C turns it back on, to be contended on purpose).
STEADY = (
    f"grid.max_new_tokens=[{NEW_TOKENS}]",
    "measure.repeats=5",
    "measure.warmup=1",
    "measure.max_host_contention=1",
)
SLEEP_MS = 10.0
EVERY_CELL = f"{{fault: slow, ms_per_token: {SLEEP_MS:g}}}"  # last in a list: faults apply first match only
SLOWED = SLEEP_MS + DELAY_MS
SLOW = f"{{fault: slow, match: {{cache: static, context_length: 64}}, ms_per_token: {SLOWED:g}}}"
OOM = "{fault: oom, match: {cache: dynamic, batch_size: 2, context_length: 64}}"


CONTENDED = (
    "grid.batch_sizes=[1]",
    "grid.caches=[dynamic]",
    "measure.max_host_contention=0.05",
    "measure.max_discarded=0",
)


@pytest.fixture(scope="module")
def store(ray_cluster, cell_template, migrated_store, tmp_path_factory) -> dict[str, str]:
    """Five sweeps in one store, in this order; the tracking URI, the folder and each sweep's parent run id."""
    folder = tmp_path_factory.mktemp("compare")
    shutil.copyfile(migrated_store, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    sweeps = {
        # first: a Ray just started still warms its workers, which the guard (off here) would have seen
        "d": ("name=compare-d", "grid.batch_sizes=[1]", "grid.caches=[dynamic]", "grid.context_lengths=[32]"),
        "a": ("name=compare-a", *GRID, f"+testing.faults=[{EVERY_CELL}]"),
        "a2": ("name=compare-a", *GRID, "rerun=true", f"+testing.faults=[{EVERY_CELL}]"),
        "b": (
            "name=compare-b",
            *GRID,
            "grid.context_lengths=[64,128]",
            f"+testing.faults=[{SLOW},{OOM},{EVERY_CELL}]",
        ),
        # kept calls only (no re-runs): each reads the burner coarsely, all of them together clearly
        "c": ("name=compare-c", *CONTENDED),
    }
    found: dict[str, str] = {"uri": uri, "folder": str(folder)}
    for key, overrides in sweeps.items():
        if key == "c":
            with burner_on(0, 180):  # a CPU cell meters every core: the burner takes about half of them
                run = sweep_in_process(folder / key, (*STEADY, *overrides), uri)
        else:
            run = sweep_in_process(folder / key, (*STEADY, *overrides), uri)
        assert run.code in (0, 1), run.out + run.err  # B has an OOM cell: exit 0 still (oom is a result)
        found[key] = (
            MlflowClient(uri)
            .search_runs(
                [experiment(uri)],
                "tags.`kvsweep.role` = 'sweep'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )[0]
            .info.run_id
        )
    return found


def experiment(uri: str) -> str:
    return MlflowClient(uri).get_experiment_by_name("kvsweep").experiment_id


def compare(store: dict[str, str], *args: str, out: str = "out") -> tuple[int, str, str, Path]:
    """`python -m kvsweep compare ...` in this process: exit code, stdout, stderr, the output folder."""
    folder = Path(store["folder"]) / out
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main(["compare", *args, "--tracking-uri", store["uri"], "--out", str(folder), "--threshold", THRESHOLD])
    return code, stdout.getvalue(), stderr.getvalue(), folder


def rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "compare.csv").open() as handle:
        return list(csv.DictReader(handle))


def a_metric(store: dict[str, str], cache: str, batch: int, metric: str) -> float:
    """A's own median for a cell, read from its MLflow run (not from compare's output)."""
    runs = MlflowClient(store["uri"]).search_runs(
        [experiment(store["uri"])],
        f"tags.`mlflow.parentRunId` = '{store['a']}' and params.cache = '{cache}' and params.batch_size = '{batch}'",
    )
    return runs[0].data.metrics[metric]


@pytest.mark.slow
def test_slowed_cells_are_slower_by_the_delay_an_oom_is_a_status_change_and_new_cells_are_added(store):
    code, out, err, folder = compare(store, "compare-a~1", "compare-b", "--log", out="a-b")
    assert code == 1, out + err
    found = rows(folder)
    slower = {(r["cache"], r["batch_size"]) for r in found if r["metric"] == "tpot_ms" and r["verdict"] == "slower"}
    assert slower == {("static", "1"), ("static", "2")}  # exactly the slowed cells
    for r in found:
        if r["metric"] == "tpot_ms" and r["verdict"] == "slower":
            # each gap between tokens sleeps DELAY_MS longer than A's: B's TPOT = A's + DELAY_MS (drift aside)
            a = a_metric(store, r["cache"], int(r["batch_size"]), "tpot_ms")
            expected = (a + DELAY_MS) / a
            assert float(r["ratio"]) == pytest.approx(expected, abs=(0.5 * a + 2.0) / a), (a, r)
        if r["cache"] == "dynamic" and r["batch_size"] == "1" and r["metric"] in ("tpot_ms", "ttft_ms", "e2e_ms"):
            assert r["verdict"] == "within noise", r  # the cell nothing slowed
        if r["metric"] == "kv_cache_bytes":
            assert r["verdict"] == "same", r  # the same cache holds the same bytes
    status = [r for r in found if r["metric"] == "status"]
    assert [(r["cache"], r["batch_size"], r["a"], r["b"], r["regression"]) for r in status] == [
        ("dynamic", "2", "ok", "oom", "true")
    ]
    added = sorted((r["cache"], r["context_length"], r["batch_size"]) for r in found if r["verdict"] == "added")
    assert added == [("dynamic", "128", "1"), ("dynamic", "128", "2"), ("static", "128", "1"), ("static", "128", "2")]
    table = out.split("\n\n")[1].splitlines()[1:]  # the printed rows, regressions first
    first_added = min(i for i, line in enumerate(table) if line.endswith("added"))
    assert all(i < first_added for i, line in enumerate(table) if "slower" in line or "status changed" in line)
    assert out.splitlines()[0].startswith("A: sweep compare-a (parent run " + store["a"])  # compare-a~1: the first

    # the files and the logged run
    page = (folder / "compare.html").read_text()
    assert page.count("<img") == len(list((folder / "figures").glob("ratio_*.png"))) >= 4
    assert "slower" in (folder / "compare.md").read_text()
    client = MlflowClient(store["uri"])
    logged = client.search_runs([experiment(store["uri"])], "tags.`kvsweep.role` = 'compare'")
    assert len(logged) == 1 and logged[0].data.tags["kvsweep.compare_a"] == store["a"]
    assert logged[0].data.tags["kvsweep.compare_b"] == store["b"] and logged[0].data.metrics["compare_regressions"] >= 3
    assert {a.path for a in client.list_artifacts(logged[0].info.run_id)} >= {"compare.csv", "compare.html"}


@pytest.mark.slow
def test_identical_sweeps_have_nothing_but_within_noise_and_exit_0(store):
    code, out, err, folder = compare(store, store["a"], store["a2"], out="a-a2")
    assert code == 0, out + err
    verdicts = {r["verdict"] for r in rows(folder)}
    assert verdicts <= {"within noise", "same", "contended"}, out
    assert "environment differs" not in out and "protocol: the same" in out


@pytest.mark.slow
def test_a_cell_measured_under_contention_gets_no_timing_verdict(store):
    code, out, err, folder = compare(store, "compare-a~1", "compare-c", out="a-c")
    timing = {r["metric"]: r["verdict"] for r in rows(folder) if r["metric"] in ("ttft_ms", "tpot_ms", "e2e_ms")}
    assert timing == {"ttft_ms": "contended", "tpot_ms": "contended", "e2e_ms": "contended"}, out
    assert sum(r["verdict"] == "removed" for r in rows(folder)) == 3  # A's other cells
    assert "protocol differs (cells matched by grid coordinates all the same): measure.max_discarded 8 -> 0" in out
    assert "measure.max_host_contention 1.0 -> 0.05" in out
    assert code == 0, out + err


@pytest.mark.slow
def test_bad_arguments_exit_2_in_one_line(store):
    cell_run = MlflowClient(store["uri"]).search_runs(
        [experiment(store["uri"])], "tags.`kvsweep.role` = 'cell'", max_results=1
    )[0]
    for args, says in (
        ((cell_run.info.run_id, store["b"]), "is not a sweep's parent run"),
        (("compare-d", "compare-b"), "nothing matches"),
        (("compare-a~5", "compare-b"), "asks for number 6"),
    ):
        code, out, err, _ = compare(store, *args, out="bad")
        assert (code, out) == (2, ""), err
        assert len(err.strip().splitlines()) == 1 and says in err, err
    proc = subprocess.run(
        [sys.executable, "-m", "kvsweep", "compare", "f" * 32, store["b"], "--tracking-uri", store["uri"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"kvsweep compare: no run {'f' * 32} in the tracking store (MlflowException)"
    ]
