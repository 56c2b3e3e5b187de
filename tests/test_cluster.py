"""Multi-node scheduling on a real Ray cluster simulated on this machine (nodes with logical GPUs).

Cells are replaced by a stand-in runner (test-only seam) that sleeps, so the test measures what the
scheduler does: one GPU per cell, no two cells on one GPU at once, concurrency, spread over nodes.
"""

import itertools
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from conftest import cell_runs

QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def two_node_cluster():
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "num_gpus": 2,
            "resources": {"accelerator_type:H100": 2},
            "include_dashboard": False,
            "object_store_memory": 80 * 1024 * 1024,
        },
    )
    cluster.add_node(
        num_cpus=2,
        num_gpus=2,
        resources={"accelerator_type:H100": 2, "fast_disk": 2},
        object_store_memory=80 * 1024 * 1024,
    )
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def sweep_command(cluster, tmp_path, *overrides, env=None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a sweep on `cluster` (None: no ray.address, the driver's own machine):
    8 stand-in cells sleeping 3 s each."""
    given = env or {}
    address = [f"ray.address={cluster.address}"] if cluster is not None else []
    store = [] if "MLFLOW_TRACKING_URI" in given else [f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
    command = [
        sys.executable,
        "-m",
        "kvsweep",
        "grid.models=[tiny-llama]",
        "grid.dtypes=[bfloat16]",
        "grid.context_lengths=[64,128]",
        "grid.batch_sizes=[1,2]",
        "grid.max_new_tokens=[4]",
        "grid.caches=[dynamic,static]",
        *address,
        "+testing.runner=kvsweep.testing.stand_ins:sleep_cell",
        "+testing.sleep_s=3",
        "ray.fork_cells=false",  # the stand-in imports no torch: no template worth warming on each node
        *store,
        f"hydra.run.dir={tmp_path}/r",
        *overrides,
    ]
    return command, {**os.environ, **QUIET, **given}


def sweep(cluster, tmp_path, *overrides, env=None):
    """A sweep on `cluster` (see `sweep_command`), run to its end."""
    command, env = sweep_command(cluster, tmp_path, *overrides, env=env)
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)


def test_cells_get_one_gpu_each_never_share_it_and_spread_over_nodes(two_node_cluster, tmp_path):
    proc = sweep(two_node_cluster, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(children) == 8
    spans = []
    for child in children:
        tags = child.data.tags
        assert child.data.params["device"] == "cuda"
        gpu_ids = tags["kvsweep.env.gpu_ids"].split(",")
        assert len(gpu_ids) == 1, tags["kvsweep.env.gpu_ids"]
        spans.append(
            (
                tags["kvsweep.env.ray_node_id"],
                gpu_ids[0],
                float(tags["kvsweep.env.started_at"]),
                float(tags["kvsweep.env.ended_at"]),
            )
        )
    by_gpu = defaultdict(list)
    for node, gpu, start, end in spans:
        by_gpu[(node, gpu)].append((start, end))
    for intervals in by_gpu.values():
        intervals.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(intervals))
    assert len({node for node, *_ in spans}) == 2  # spread over both nodes
    peak = max(sum(1 for _, _, s, e in spans if s <= t < e) for _, _, t, _ in spans)
    assert peak == 4  # the cluster's GPU count


def test_unknown_gpu_kind_fails_fast_listing_what_the_cluster_has(two_node_cluster, tmp_path):
    proc = sweep(two_node_cluster, tmp_path, "ray.accelerator_type=A100")
    assert proc.returncode == 2
    assert "A100" in proc.stderr and "H100" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_gpu_kind_and_custom_resources_restrict_placement(two_node_cluster, tmp_path):
    proc = sweep(two_node_cluster, tmp_path, "ray.accelerator_type=H100", "+ray.resources={fast_disk: 1}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, children = cell_runs(f"sqlite:///{tmp_path}/mlflow.db")
    nodes = {c.data.tags["kvsweep.env.ray_node_id"] for c in children}
    assert len(nodes) == 1  # only the node with fast_disk
    missing = sweep(two_node_cluster, tmp_path, "+ray.resources={nvme: 1}", "rerun=true")
    assert missing.returncode == 2 and "nvme" in missing.stderr and "fast_disk" in missing.stderr


def test_dry_run_resolves_device_auto_from_the_cluster_like_a_run(two_node_cluster, tmp_path):
    """The driver sees no GPU, the cluster has four: `auto` means the cluster's, in a dry run as in a run."""
    no_gpu_here = {"CUDA_VISIBLE_DEVICES": ""}  # CUDA's convention: hides every GPU of this machine, if it has any
    alone = sweep(None, tmp_path, "dry_run=true", env=no_gpu_here)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "8 cells on cpu" in alone.stdout, alone.stdout  # without the cluster: this machine's CPU
    proc = sweep(two_node_cluster, tmp_path, "dry_run=true", env=no_gpu_here)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 cells on cuda" in proc.stdout, proc.stdout
    assert not (tmp_path / "mlflow.db").exists()  # nothing logged


def test_ray_address_in_the_environment_is_joined_as_ray_init_joins_it(two_node_cluster, tmp_path, mlflow_server):
    """`RAY_ADDRESS` set and `ray.address` empty (a head node's shell, a Ray job's entrypoint): the sweep runs
    on that cluster (its GPUs, both nodes), says so first, and MLflow's own variables choose where it logs;
    `ray.address=local` keeps it on a local instance of this machine whatever RAY_ADDRESS says."""
    env = {
        "RAY_ADDRESS": two_node_cluster.address,
        "MLFLOW_TRACKING_URI": mlflow_server,
        "MLFLOW_EXPERIMENT_NAME": "from-env",
        "CUDA_VISIBLE_DEVICES": "",
    }
    shown = subprocess.run(
        [sys.executable, "-m", "kvsweep", "--cfg", "job"], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert f"address: {two_node_cluster.address}" in shown.stdout
    assert f"tracking_uri: {mlflow_server}" in shown.stdout and "experiment: from-env" in shown.stdout

    proc = sweep(None, tmp_path, "grid.caches=[dynamic]", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Ray: joining the cluster at {two_node_cluster.address} (from RAY_ADDRESS" in proc.stdout
    _, children = cell_runs(mlflow_server, "from-env")
    assert len(children) == 4 and {c.data.params["device"] for c in children} == {"cuda"}  # the cluster's GPUs
    assert len({c.data.tags["kvsweep.env.ray_node_id"] for c in children}) == 2

    local = sweep(None, tmp_path, "grid.caches=[dynamic]", "ray.address=local", "dry_run=true", env=env)
    assert local.returncode == 0 and "4 cells on cpu" in local.stdout, local.stdout + local.stderr
