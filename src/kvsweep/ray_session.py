"""Start or join Ray quietly, and read what the cluster offers before asking it for anything."""

import os
from dataclasses import dataclass

from kvsweep.errors import ClusterError

# Ray 2.60 enables token auth and usage stats for local clusters and says so loudly.
QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
OBJECT_STORE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class RaySession:
    started_here: bool  # we own it: shut it down at the end
    gpus: float
    cpus: float


def connect(address: str) -> RaySession:
    """Empty address: a fresh local instance; otherwise join (`auto`, `ray://...`) with no resource args.

    An already-initialised Ray (a test session, a notebook) is reused as it is.
    """
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    started_here = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        else:
            import torch

            ray.init(
                address="local",
                num_cpus=os.cpu_count(),
                num_gpus=torch.cuda.device_count(),
                include_dashboard=False,
                log_to_driver=False,
                object_store_memory=OBJECT_STORE_BYTES,
                logging_level="ERROR",
            )
        started_here = True
    resources = ray.cluster_resources()
    return RaySession(started_here, float(resources.get("GPU", 0)), float(resources.get("CPU", 0)))


def resolve_device(requested: str, session: RaySession) -> str:
    """`auto` means CUDA when the cluster has GPUs; asking for CUDA on a GPU-less cluster fails now."""
    if requested == "auto":
        return "cuda" if session.gpus > 0 else "cpu"
    if requested == "cuda" and session.gpus == 0:
        raise ClusterError(
            f"device=cuda but the Ray cluster has no GPUs (it has {session.cpus:g} CPUs); "
            "use device=cpu or join a cluster with GPUs (ray.address=...)"
        )
    return requested


def check_fits(device: str, session: RaySession, gpus_per_cell: int, cpus_per_cell: int) -> None:
    """Work no node can hold waits forever in Ray: refuse it up front instead."""
    if device == "cuda" and gpus_per_cell > session.gpus:
        raise ClusterError(f"ray.gpus_per_cell={gpus_per_cell} but the cluster has {session.gpus:g} GPUs")
    if cpus_per_cell > session.cpus:
        raise ClusterError(f"ray.cpus_per_cell={cpus_per_cell} but the cluster has {session.cpus:g} CPUs")


def shutdown(session: RaySession) -> None:
    if session.started_here:
        import ray

        ray.shutdown()
