"""Nodes of one cluster must measure with the same code: a real Ray cluster of three nodes on this machine.

The nodes run the same packages, so one is told to report another Transformers and one another GPU
through the test seam `KVSWEEP_TESTING_REPORTED_VERSIONS`, set in that node's environment only (as
`ray start` would be run there). Cells are a stand-in that sleeps; what is tested is what the driver
does before any cell and what each cell run records of its node.
"""

import importlib.metadata
import json
import os
import subprocess
import time

import pytest

from conftest import cell_runs
from kvsweep.testing.testing_config import REPORTED_VERSIONS_ENV
from test_cluster import sweep, sweep_command  # 8 stand-in cells sleeping 3 s: the first 6 at once, on every node

QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
ODD_TRANSFORMERS = "9.9.9"
ODD_GPU = "NVIDIA A100-SXM4-80GB"
NODE = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def three_nodes():
    """A head and a node alike; one node reporting Transformers 9.9.9, one an A100 (the head's GPUs are what
    NVML finds here). `alike` is a resource only the head and the A100 node offer: a sweep that asks for it
    cannot run a cell on the odd-Transformers node."""
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE, "include_dashboard": False, "resources": {"alike": 2}}
    )
    odd_software = cluster.add_node(
        **NODE, env_vars={REPORTED_VERSIONS_ENV: json.dumps({"transformers": ODD_TRANSFORMERS})}
    )
    odd_gpu = cluster.add_node(
        **NODE, resources={"alike": 2}, env_vars={REPORTED_VERSIONS_ENV: json.dumps({"gpu": ODD_GPU})}
    )
    cluster.wait_for_nodes()
    yield cluster, odd_software.node_id, odd_gpu.node_id
    cluster.shutdown()


def by_node(tmp_path) -> dict[str, list]:
    _, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    found: dict[str, list] = {}
    for child in children:
        found.setdefault(child.data.tags["kvsweep.env.ray_node_id"], []).append(child)
    return found


@pytest.mark.slow
def test_a_node_with_other_transformers_stops_the_sweep_before_any_cell_naming_it(three_nodes, tmp_path):
    cluster, odd_software, _ = three_nodes
    proc = sweep(cluster, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, proc.stderr
    here = importlib.metadata.version("transformers")
    assert f"transformers {here} on the driver" in line and f"{ODD_TRANSFORMERS} on " in line
    assert f"(node {odd_software[:8]})" in line.split(f"{ODD_TRANSFORMERS} on ")[1]
    assert "ray.allow_mixed_versions=true" in line
    assert not (tmp_path / "mlflow.db").exists()  # no cell ran, nothing was logged


@pytest.mark.slow
def test_allow_mixed_versions_measures_anyway_says_so_first_and_each_cell_carries_its_nodes_software(
    three_nodes, tmp_path
):
    cluster, odd_software, odd_gpu = three_nodes
    proc = sweep(cluster, tmp_path, "ray.allow_mixed_versions=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[:5]
    assert any("measuring anyway" in line and ODD_TRANSFORMERS in line for line in first), proc.stdout
    assert any("different GPUs" in line and ODD_GPU in line for line in first), proc.stdout
    cells = by_node(tmp_path)
    assert sum(map(len, cells.values())) == 8 and len(cells) == 3, {k: len(v) for k, v in cells.items()}
    software = {node: {c.data.params["node_software"] for c in runs} for node, runs in cells.items()}
    assert all(len(values) == 1 for values in software.values())  # one fingerprint per node
    alike = {next(iter(v)) for node, v in software.items() if node != odd_software}
    assert len(alike) == 1 and software[odd_software] != alike  # the odd node's cells say they ran other code
    gpus = {node: {c.data.params["gpu_model"] for c in runs} for node, runs in cells.items()}
    assert gpus[odd_gpu] == {ODD_GPU} and all(ODD_GPU not in v for node, v in gpus.items() if node != odd_gpu)


@pytest.mark.slow
def test_a_gpu_model_difference_is_said_not_refused_and_each_cell_records_its_gpu(three_nodes, tmp_path):
    cluster, odd_software, odd_gpu = three_nodes
    proc = sweep(cluster, tmp_path, "+ray.resources={alike: 1}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "different software" not in proc.stdout + proc.stderr  # the odd-software node runs no cell: not asked
    assert any("different GPUs" in line and ODD_GPU in line for line in proc.stdout.splitlines()[:5]), proc.stdout
    cells = by_node(tmp_path)
    assert odd_software not in cells and len(cells) == 2
    gpus = {node: {c.data.params["gpu_model"] for c in runs} for node, runs in cells.items()}
    assert gpus[odd_gpu] == {ODD_GPU}
    assert len({value for values in gpus.values() for value in values}) == 2  # two GPU models, told per cell


@pytest.mark.slow
def test_nodes_that_join_after_connect_are_checked_by_their_first_cell(tmp_path):
    """A cluster of one node (one GPU) when the sweep connects; two nodes join while it runs: one alike, one
    reporting Transformers 9.9.9. Cells placed on the alike node measure and record its software, the same
    fingerprint as the surveyed node's (not "unchecked"); those placed on the odd node measure nothing and fail
    in one line naming the node and the field."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "num_gpus": 1, "include_dashboard": False})
    try:
        command, env = sweep_command(cluster, tmp_path, "ray.max_concurrent=6")  # more than the one GPU at connect
        proc = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        journal, deadline = tmp_path / "r" / "journal.jsonl", time.monotonic() + 300
        while not journal.exists() or '"status": "ok"' not in journal.read_text():  # a first cell measured
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.3)
        alike = cluster.add_node(**NODE)
        odd = cluster.add_node(**NODE, env_vars={REPORTED_VERSIONS_ENV: json.dumps({"transformers": ODD_TRANSFORMERS})})
        out, err = proc.communicate(timeout=600)
    finally:
        cluster.shutdown()
    _, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    refused = [c for c in children if c.data.tags["kvsweep.status"] == "error"]
    measured = [c for c in children if c.data.tags["kvsweep.status"] == "ok"]
    assert len(refused) + len(measured) == 8 and refused, out + err
    here = importlib.metadata.version("transformers")
    for run in refused:  # placed on the odd node: measured nothing, said where and why
        error = run.data.tags["kvsweep.error"]
        assert f"(node {odd.node_id[:8]}) joined after the sweep checked its nodes" in error, error
        assert f"transformers {ODD_TRANSFORMERS} here, {here} on the checked nodes" in error
    nodes = {c.data.tags["kvsweep.env.ray_node_id"] for c in measured}
    assert odd.node_id not in nodes and alike.node_id in nodes, (nodes, out + err)
    fingerprints = {c.data.params["node_software"] for c in measured}  # the head's and the late alike node's
    assert len(fingerprints) == 1 and not next(iter(fingerprints)).startswith("unchecked"), fingerprints
    assert proc.returncode == 1  # some cells ended in error
