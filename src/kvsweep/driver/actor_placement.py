"""When a cell's clock starts, and which waiting cells hold a place: Ray may keep an actor unplaced.

An actor waiting for its resources (another job's GPUs, an offloaded cell's host memory) is not running, so a
cell's timeout counts from when Ray has placed its actor and its `ready()` has answered. An unplaced actor is given
up as `timeout` (retried) once `cell_timeout_s` passes with no cell of this sweep placed or ended: ours are killed
at their own timeouts, so what it waits for is held by another job, or the node that had it left.

Host memory (`memory_ask`): one memory job waits at a time, the queue's others keep their order behind it. It
holds one of `max_concurrent`'s places for `grace_s` (an actor whose resources are free is up by then), and again
after each cell of this sweep ends (what it waits for may be free now); otherwise jobs that ask no memory run in
its place, so no GPU idles behind it. GPUs never oversubscribe (each actor asks Ray for them); memory freed by
something outside the sweep may let the waiting cell run as one more than `max_concurrent`.

The reservations are pure arithmetic on the cluster's node resources, tested without a cluster. The templates are
launched as soon as Ray is up (`launch_templates`), so their seconds of importing torch overlap the driver's
planning and opening MLflow.
"""

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from kvsweep.cell.actor import template_name
from kvsweep.cell.template import CellTemplate
from kvsweep.driver.ray_session import CellNeeds, can_hold
from kvsweep.errors import first_line
from kvsweep.grid import Cell
from kvsweep.units import GB


@dataclass
class Job:
    cell_id: str
    cell: Cell
    attempt: int = 1
    host_memory_bytes: int = 0  # pinned host memory the plan predicts (offloaded caches): reserved from Ray


@dataclass
class Running:
    """A started job: its actor, and until Ray has placed that actor the ObjectRef of its `ready()`."""

    job: Job
    actor: Any
    placing: Any  # ObjectRef of the actor's `ready()` until Ray has placed it and it is up; then None
    memory_ask: int = 0  # bytes of Ray's `memory` resource its actor reserves
    created: float = field(default_factory=time.monotonic)
    placed_at: float | None = None
    told_waiting: bool = False

    @property
    def since(self) -> float:
        """When its clock started: once placed, then; before, when its actor was made."""
        return self.created if self.placed_at is None else self.placed_at

    def note_placed(self, now: float) -> None:
        self.placing, self.placed_at = None, now

    def timed_out(self, now: float, timeout_s: float) -> bool:
        """Placed, and past its timeout since (an actor waiting for resources is not running)."""
        return self.placed_at is not None and now - self.placed_at > timeout_s

    @property
    def waits_for_memory(self) -> bool:
        return self.placing is not None and bool(self.memory_ask)


class Placement:
    """The sweep's placement clock: when a cell of it was last placed or ended, and what follows from it."""

    def __init__(self, timeout_s: float, grace_s: float) -> None:
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self.ended_at = -math.inf  # when a cell of this sweep last ended (freeing what it held)
        self.changed_at = -math.inf  # when a cell of this sweep last was placed or ended

    def look(self, running: Iterable[Running], now: float) -> None:
        """Start the clock of every cell whose actor Ray has placed and that is up since the last look."""
        placing = {entry.placing: entry for entry in running if entry.placing is not None}
        if placing:
            placed, _ = ray.wait(list(placing), num_returns=len(placing), timeout=0)
            for ref in placed:
                placing[ref].note_placed(now)
            if placed:
                self.changed_at = now  # what they hold, they hold for their timeout at most

    def cells_ended(self, now: float) -> None:
        """What they held is free now: the unplaced ones' wait starts again."""
        self.ended_at = self.changed_at = now

    def given_up(self, entry: Running, now: float) -> bool:
        """Unplaced through a whole `timeout_s` in which no cell of this sweep was placed or ended."""
        return entry.placing is not None and now - max(entry.created, self.changed_at) > self.timeout_s

    def holds_a_place(self, entry: Running, now: float) -> bool:
        """Whether a cell counts against `max_concurrent`: all but a memory job Ray has kept unplaced past
        `grace_s` since it was made or a cell of this sweep last ended (it holds nothing yet)."""
        if not entry.waits_for_memory:
            return True
        return now - max(entry.created, self.ended_at) <= self.grace_s

    @staticmethod
    def next_job(waiting: deque[Job], running: Iterable[Running], ask: Callable[[Job], int]) -> Job | None:
        """The queue's first job, taken out of it; while a memory job waits for Ray, the first that asks no
        memory (one memory job waits at a time: the others keep their order behind it)."""
        memory_waiting = any(entry.waits_for_memory for entry in running)
        for index, job in enumerate(waiting):
            if not memory_waiting or not ask(job):
                del waiting[index]
                return job
        return None

    def newly_waiting(self, running: Iterable[Running], now: float) -> list[tuple[Job, str]]:
        """Once per attempt, the memory jobs Ray keeps waiting while other cells take their place, with a
        line saying so."""
        lines = []
        for entry in running:
            if entry.told_waiting or entry.placing is None or self.holds_a_place(entry, now):
                continue
            entry.told_waiting = True
            lines.append(
                (
                    entry.job,
                    f"{entry.job.cell.label}: waits for {entry.memory_ask / GB:.1f} GB of Ray memory on a node "
                    "(its offloaded cache's pinned blocks); cells that ask none run meanwhile; given up after "
                    f"{self.timeout_s:g} s (ray.cell_timeout_s) in which no cell of this sweep starts or ends",
                )
            )
        return lines

    def given_up_message(self, entry: Running, now: float, resources: dict[str, float]) -> str:
        """Why an unplaced cell was given up: what it waited for, and who must hold it."""
        waited = f"waited {now - entry.created:.0f} s"
        if entry.memory_ask:
            wanted, holder = f"{entry.memory_ask / GB:.1f} GB of Ray memory on a node", "that memory"
        else:
            asked = ", ".join(f"{v:g} {k}" for k, v in resources.items())
            wanted, holder = f"Ray to place its actor ({asked})", "them"
        return (
            f"{waited} for {wanted}; none freed: no cell of this sweep started or ended in "
            f"{self.timeout_s:g} s (ray.cell_timeout_s), so another job holds {holder} or the node "
            "that had it left; actor killed"
        )


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


def spares_wanted(prestart: int, needs: CellNeeds) -> int:
    """Spare actors to keep ready: `ray.prestart` for CPU cells, none for cells that hold GPUs (a spare
    would wait for, or hold idle, a GPU; docs/cluster.md)."""
    return 0 if needs.gpus > 0 else prestart


GPU_CELL_MAX_CPUS = 8
NODE_CPUS_KEPT = 1  # per node, for Ray's daemons (raylet, GCS), the driver, MLflow and the template


def auto_cpus_per_cell(needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> int:
    """`ray.cpus_per_cell=0` (auto): the CPUs Ray reserves for one cell, so its threads can follow them.

    A CPU cell: 1 (it computes on every core it may use, and cells run one at a time; `cell/process.py`). A GPU
    cell: (CPUs - `NODE_CPUS_KEPT`) x its GPUs // the node's GPUs, so the node's concurrent cells use its cores once
    together and leave one to the processes every node runs besides them (each CUDA cell is pinned to cores of its
    own, `cell/cpu_slots.py`: had all been lent, those processes would show as some cell's contention). Taken on the
    node that offers the fewest among those able to hold the cell, at most `GPU_CELL_MAX_CPUS` (a GPU cell's CPU
    work is mostly one thread launching kernels), at least 1.
    """
    if needs.gpus <= 0:
        return 1
    wanted = {k: v for k, v in needs.as_resources().items() if k != "CPU"}
    shares = [
        int(max(0.0, node.get("CPU", 0.0) - NODE_CPUS_KEPT) * needs.gpus // node["GPU"])
        for node in nodes
        if can_hold(node, wanted)
    ]
    return max(1, min(GPU_CELL_MAX_CPUS, min((s for s in shares if s >= 1), default=1)))


def with_cpus_resolved(needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> CellNeeds:
    """`needs` with an auto CPU count (0) replaced by `auto_cpus_per_cell`; an explicit count as it is."""
    return needs if needs.cpus > 0 else replace(needs, cpus=auto_cpus_per_cell(needs, nodes))


def memory_ask(host_bytes: int, needs: CellNeeds, nodes: Sequence[dict[str, float]]) -> int:
    """Bytes of Ray's `memory` resource a cell's actor reserves: its offloaded cache's predicted pinned memory
    (`plan/offload.py`), so Ray puts side by side on a node only the offloaded cells whose blocks fit (a node's
    `memory` is what it had free when Ray started, less its object store). At most what the best node able to
    hold the cell offers: Ray would keep a larger ask pending forever. 0: no ask.
    """
    if host_bytes <= 0:
        return 0
    wanted = needs.as_resources()
    offered = max((node.get("memory", 0.0) for node in nodes if can_hold(node, wanted)), default=0.0)
    return int(min(host_bytes, offered))
