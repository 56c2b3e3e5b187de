"""The warm per-node templates cells are forked from: launched as soon as Ray is up, awaited by the first cell.

A template spends seconds importing torch and Transformers. Launching it right after connecting lets
that overlap the driver's own work (planning, opening MLflow) instead of following it.
"""

from dataclasses import dataclass, field
from typing import Any

import ray

from kvsweep.cell.actor import template_name
from kvsweep.cell.template import CellTemplate
from kvsweep.errors import first_line

TEMPLATE_RESTARTS = 2  # a dead template is replaced by a fresh one (Ray restarts it), never reused
TEMPLATE_START_S = 300.0  # preloading torch and Transformers on a busy node


@dataclass
class Templates:
    """Handles of the launched templates (they keep the actors alive) and their readiness."""

    handles: list[Any] = field(default_factory=list)
    ready: list[Any] = field(default_factory=list)
    problem: str | None = None  # None until awaited; "" when every template is ready

    def wait(self) -> str:
        """ "" once all are ready, else why not (the sweep then measures in each cell's own actor process)."""
        if self.problem is None:
            try:
                ray.get(self.ready, timeout=TEMPLATE_START_S)
                self.problem = ""
            except Exception as exc:  # e.g. killed while starting (Ray's memory monitor), an import that touched CUDA
                self.problem, self.handles = first_line(exc), []
        return self.problem


def launch_templates() -> Templates:
    """One template per live node (the one this driver already has, if any); returns at once."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    template_class = ray.remote(num_cpus=0, max_restarts=TEMPLATE_RESTARTS, max_task_retries=0, max_concurrency=64)(
        CellTemplate
    )
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    handles = [
        template_class.options(
            name=template_name(node),
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote()
        for node in nodes
    ]
    return Templates(handles, [handle.ready.remote() for handle in handles])
