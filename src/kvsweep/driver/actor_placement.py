"""When a cell's clock starts, and which waiting cells hold a place: Ray may keep an actor unplaced.

An actor waits for its resources (another job's GPUs, an offloaded cell's host memory), and a cell
waiting for them is not running. So every cell's timeout counts from when Ray has placed its actor
and the actor is up (its `ready()` has answered). An actor Ray has not placed is given up as
`timeout` (retried like any) once `cell_timeout_s` passes in which no cell of this sweep was placed
or ended: each of ours is killed at its own timeout, so any placed before that window would have
ended by then; what it waits for is held by another job, or the node that had it left.

Host memory: a job with predicted pinned host memory (an offloaded cache, `Job.host_memory_bytes`)
has its actor reserve that much of Ray's `memory` resource (`cell_resources.memory_ask`), so a node
runs at once only the offloaded cells whose pinned blocks fit it; the next waits for Ray to place it.
One such job waits at a time (the queue's other memory jobs keep their order behind it). It holds one
of `max_concurrent`'s places for `grace_s` (an actor whose resources are free is up by then), and
again for as long after each cell of this sweep ends (what it waits for may be free now); else it
holds nothing, and the queue's next jobs that ask no memory run in its place, so no GPU idles behind
it. GPU cells never outnumber the GPUs: each actor asks Ray for its GPUs. If memory is freed by
something other than a cell of this sweep ending, the waiting cell may run beside `max_concurrent`
others: one more cell than that, and only while GPUs are free for it.
"""

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import ray

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
