"""Start or join Ray quietly, and read what the cluster offers before asking it for anything.

Import what the driver needs later (MLflow, matplotlib) while Ray starts, instead of after it.

`ray.init` mostly waits on the processes it starts; a background thread fills that wait with the
imports of the tracking and report stages (2-3 s on a small machine). A failed import is left for
the stage that needs it to report.
"""

import contextlib
import importlib
import os
import threading
from dataclasses import dataclass, field

from kvsweep.caches import CacheStrategy
from kvsweep.config.tool_variables import LOCAL_RAY
from kvsweep.errors import ClusterError

# Ray 2.60 enables token auth and usage stats for local clusters and says so loudly.
QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
# Ray starts workers at nice 15: every cell would measure at low priority and any ordinary process
# on the host would preempt it. kvsweep's cells measure; they run at normal priority.
WORKER_NICENESS_ENV = {"RAY_worker_niceness": "0"}
OBJECT_STORE_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class RaySession:
    started_here: bool  # we own it: shut it down at the end
    gpus: float
    cpus: float
    local: bool = False  # a local instance this process started (now or earlier): its workers run this Python
    node_gpus: tuple[float, ...] = ()  # each live node's GPUs: how many cells fit at once is counted node by node


_local_instance = ""  # the GCS address of the local instance this process started, until it shuts it down


def connect(address: str) -> RaySession:
    """Empty address or `local`: a fresh local instance; otherwise join (`auto`, `ray://...`) with no resource
    args. `RAY_ADDRESS` was resolved into the address when the config was composed (`config/tool_variables.py`).

    An already-initialised Ray (a test session, a notebook) is reused as it is; `local` says whether this
    process started it as a local instance (`connect("")`), whose workers see what this process sees.
    """
    global _local_instance
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    started_here = False
    if not ray.is_initialized():
        if address and address != LOCAL_RAY:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        else:
            for key, value in WORKER_NICENESS_ENV.items():
                os.environ.setdefault(key, value)
            ray.init(
                address="local",
                num_cpus=os.cpu_count(),  # GPUs: Ray's own detection (NVML, CUDA_VISIBLE_DEVICES), no torch here
                include_dashboard=False,
                log_to_driver=False,
                object_store_memory=OBJECT_STORE_BYTES,
                logging_level="ERROR",
            )
            _local_instance = ray.get_runtime_context().gcs_address
        started_here = True
    resources = ray.cluster_resources()
    local = bool(_local_instance) and _local_instance == ray.get_runtime_context().gcs_address
    nodes = tuple(float(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive"))
    return RaySession(started_here, float(resources.get("GPU", 0)), float(resources.get("CPU", 0)), local, nodes)


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


@dataclass(frozen=True)
class CellNeeds:
    """What one cell's actor asks Ray for."""

    gpus: int
    cpus: int
    accelerator_type: str = ""
    resources: dict[str, float] = field(default_factory=dict)

    def as_resources(self) -> dict[str, float]:
        needs = {"CPU": float(self.cpus), **self.resources}
        if self.gpus:
            needs["GPU"] = float(self.gpus)
        if self.accelerator_type:
            needs[f"{ACCELERATOR_PREFIX}{self.accelerator_type}"] = 0.001
        return needs

    def actor_options(self) -> dict[str, object]:
        options: dict[str, object] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.accelerator_type:
            options["accelerator_type"] = self.accelerator_type
        if self.resources:
            options["resources"] = dict(self.resources)
        return options


ACCELERATOR_PREFIX = "accelerator_type:"
BUILTIN = {"CPU", "GPU", "memory", "object_store_memory"}


def can_hold(node: dict[str, float], wanted: dict[str, float]) -> bool:
    """Whether a node's resources (`ray.nodes()`'s `Resources`) cover every one of `wanted`."""
    return all(node.get(k, 0.0) >= v for k, v in wanted.items())


def check_fits(needs: CellNeeds) -> None:
    """Work no node can hold waits forever in Ray: refuse it up front, saying what the cluster has."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    wanted = needs.as_resources()
    if any(can_hold(node, wanted) for node in nodes):
        return
    kinds = sorted({k.removeprefix(ACCELERATOR_PREFIX) for n in nodes for k in n if k.startswith(ACCELERATOR_PREFIX)})
    custom = sorted(
        {k for n in nodes for k in n if k not in BUILTIN and not k.startswith(("node:", ACCELERATOR_PREFIX))}
    )
    largest = max(nodes, key=lambda n: n.get("GPU", 0.0), default={})
    asked = ", ".join(f"{k}={v:g}" for k, v in wanted.items())
    raise ClusterError(
        f"no node of the Ray cluster can hold one cell ({asked}); the cluster has {len(nodes)} nodes, "
        f"at most {largest.get('GPU', 0):g} GPUs and {largest.get('CPU', 0):g} CPUs on one node, GPU kinds: "
        f"{', '.join(kinds) or 'none labelled'}, custom resources: {', '.join(custom) or 'none'}"
    )


def shutdown(session: RaySession) -> None:
    global _local_instance
    if session.started_here:
        import ray

        ray.shutdown()
        _local_instance = ""


def send_strategies_by_value(strategies: list[CacheStrategy]) -> list[CacheStrategy]:
    """Strategies registered in the driver travel to each actor with their code, not by module name.

    A cell's fresh process can import kvsweep but not necessarily the module that registered a
    strategy (a test file, a notebook, a script): its byte accounting is pickled by value.
    """
    import sys

    import ray.cloudpickle

    for strategy in strategies:
        module = sys.modules.get(strategy.stored_bytes.__module__)
        if module is not None and not module.__name__.startswith(("kvsweep.", "__main__")):
            ray.cloudpickle.register_pickle_by_value(module)
    return strategies


LATER_MODULES = (
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "kvsweep.tracking.sink",
    "kvsweep.report.report_files",
)


def prewarm(modules: tuple[str, ...] = LATER_MODULES) -> threading.Thread:
    def work() -> None:
        for name in modules:
            with contextlib.suppress(Exception):  # the stage that imports it for real says what is wrong
                importlib.import_module(name)

    thread = threading.Thread(target=work, name="kvsweep-prewarm", daemon=True)
    thread.start()
    return thread
