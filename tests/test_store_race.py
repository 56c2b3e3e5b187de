"""Processes that open one fresh sqlite MLflow store at the same instant all get a working store.

MLflow makes a fresh store's tables when a client is made, with no lock: on this machine four plain
clients started together at a barrier fail (`table latest_metrics already exists`, `duplicate column
name: step`, alembic finding another process's version) in every try. kvsweep's trackers take turns
and retry after another program's collision (`tracking/store.py`). Real processes, forked at a barrier.
"""

import multiprocessing

import pytest
from mlflow import MlflowClient

from kvsweep.tracking.client import SweepTracker

pytestmark = pytest.mark.heavy  # multi-process reliability: four processes making MLflow's schema, 10-20 s


def _open(uri: str, barrier, answers, plain: bool) -> None:
    barrier.wait()
    try:
        if plain:  # what `mlflow ui` does on a fresh store: a client of its own, no turn taken
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            answers.put(("plain", "ok"))
        else:
            answers.put(("kvsweep", SweepTracker(uri, "kvsweep").experiment_id))
    except Exception as exc:
        answers.put(("plain" if plain else "kvsweep", f"failed: {type(exc).__name__}: {str(exc)[:300]}"))


def _at_once(uri: str, plain: int, trackers: int) -> list[tuple[str, str]]:
    """`plain` bare MLflow clients and `trackers` kvsweep trackers open `uri` at the same instant."""
    fork = multiprocessing.get_context("fork")  # mlflow and kvsweep already imported: all start together
    barrier, answers = fork.Barrier(plain + trackers), fork.Queue()
    processes = [fork.Process(target=_open, args=(uri, barrier, answers, i < plain)) for i in range(plain + trackers)]
    for process in processes:
        process.start()
    found = [answers.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    return found


def test_sweeps_opening_one_fresh_store_at_once_all_get_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    found = _at_once(uri, plain=0, trackers=4)
    ids = {answer for _, answer in found}
    assert len(ids) == 1 and not next(iter(ids)).startswith("failed"), found  # one experiment, the same for all
    [experiment] = [e for e in MlflowClient(tracking_uri=uri).search_experiments() if e.name == "kvsweep"]
    assert experiment.experiment_id in ids


def test_a_sweep_survives_another_program_making_the_tables_at_the_same_time(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    found = _at_once(uri, plain=1, trackers=3)
    ours = [answer for who, answer in found if who == "kvsweep"]
    assert len(ours) == 3 and len(set(ours)) == 1 and not ours[0].startswith("failed"), found
    # The other program may have failed (it took no turn); the store it left works for everyone.
    assert MlflowClient(tracking_uri=uri).get_experiment(ours[0]).name == "kvsweep"
