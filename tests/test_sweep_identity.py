"""A sweep resumed across a kvsweep release that changed what cells report never mixes old and new numbers."""

import hashlib
import json
from dataclasses import asdict

from conftest import FAST, cell_runs
from kvsweep.config.compose import compose_config
from kvsweep.driver.sweep_tracking import sweep_key
from kvsweep.grid import PROTOCOL_VERSION


def hand_key(cfg, revision: int | None) -> str:
    """The key as the first kvsweep computed it (before search, slo, the memory limit and quality trials
    existed), with the measurement revision added when there is one."""
    whole = asdict(cfg)
    measure = {k: v for k, v in whole["measure"].items() if k not in ("quality_trials", "device_memory_limit_gb")}
    identity = {k: whole[k] for k in ("name", "grid", "device", "trust_remote_code")}
    identity |= {"measure": measure, "experiment": cfg.mlflow.experiment}
    if revision is not None:
        identity["measurement_revision"] = revision
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def test_revision_one_is_the_key_sweeps_had_and_the_current_revision_another():
    cfg = compose_config([]).config
    assert sweep_key(cfg, revision=1) == hand_key(cfg, None)
    assert sweep_key(cfg, revision=2) == hand_key(cfg, 2)
    whole = asdict(cfg)
    keyed = ("name", "grid", "measure", "inputs", "search", "slo", "device", "trust_remote_code")
    identity = {k: whole[k] for k in keyed} | {"experiment": cfg.mlflow.experiment, "version": 3}
    assert PROTOCOL_VERSION == 3
    assert sweep_key(cfg) == hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def test_every_measure_key_is_part_of_the_sweeps_key():
    """The whole measure config keys a sweep: a key once outside it (`wait_for_idle_gpu_s`) no longer resumes a
    sweep measured another way."""
    base = sweep_key(compose_config([]).config)
    for override in ("measure.wait_for_idle_gpu_s=30", "measure.quality_trials=4", "measure.max_discarded=2"):
        assert sweep_key(compose_config([override]).config) != base, override
    assert sweep_key(compose_config(["ray.max_retries=3", "report.max_kl=0.5"]).config) == base  # how it runs


def test_a_parent_measured_by_an_earlier_revision_is_left_and_every_cell_measured_again(run_sweep):
    """The earlier kvsweep's parent is what a previous release left: this sweep's parent, keyed by revision 1."""
    from mlflow import MlflowClient

    first = run_sweep("grid.caches=[dynamic,static]")
    assert first.code == 0
    [old_parent], old_cells = cell_runs(first.tracking_uri)
    client = MlflowClient(tracking_uri=first.tracking_uri)
    revision_one = sweep_key(compose_config([*FAST, "grid.caches=[dynamic,static]"]).config, revision=1)
    old_key = old_parent.data.tags["kvsweep.sweep_key"]
    client.set_tag(old_parent.info.run_id, "kvsweep.sweep_key", revision_one)  # as the earlier release keyed it

    second = run_sweep("grid.caches=[dynamic,static]")
    assert second.code == 0, second.out + second.err
    assert "resuming" not in second.out
    assert f"parent run {old_parent.info.run_id} holds this sweep measured by an earlier kvsweep" in second.out
    assert "measurement revision 1" in second.out and "every cell is measured again" in second.out
    parents, cells = cell_runs(first.tracking_uri)
    assert len(parents) == 2 and len(cells) == 2 * len(old_cells) == 4
    by_parent: dict[str, int] = {}
    for cell in cells:
        by_parent[cell.data.tags["mlflow.parentRunId"]] = by_parent.get(cell.data.tags["mlflow.parentRunId"], 0) + 1
    assert by_parent == {p.info.run_id: 2 for p in parents}  # the old parent kept its two, nothing added to it
    new_parent = next(p for p in parents if p.info.run_id != old_parent.info.run_id)
    assert new_parent.data.tags["kvsweep.sweep_key"] == old_key  # what this release keys the sweep by

    third = run_sweep("grid.caches=[dynamic,static]")  # this release's own parent now resumes, silently
    assert "resuming: 2 of 2 cells" in third.out and "earlier kvsweep" not in third.out
