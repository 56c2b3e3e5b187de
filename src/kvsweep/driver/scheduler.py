"""Run cells on Ray: one fresh actor per cell, bounded concurrency, timeouts, retries in the driver.

Results stream back in completion order through `on_result`. Ray's own retries are off (a Ray retry
would re-run work in a new process behind our back); the driver retries crashed and timed-out cells
itself, each attempt in a fresh actor. `admit` may answer for a cell without running it (inferred OOM).

Forking (`ray.fork_cells`, the default): one warm `CellTemplate` per node, launched as soon as Ray
is up (`driver.templates`) and awaited here before the first cell; each cell's actor then has its
measurement run in a process forked from it (`cell/actor.py`), so no cell imports anything.

Prestart (CPU cells only): up to `prestart` spare actors are created ahead of need, so the next cell
skips Ray's process start. Without forking a spare also imports the cell code, overlapping the running
cell. The CPU is the measured device: a spare imports under the host's gate (exclusive lock) and a
cell's measured phase holds the gate shared, so no spare is preparing while a cell on this host is
being measured.

GPU cells get no spares. A Ray actor's resources are fixed when it is created, so a spare must ask
for the GPUs its cell will hold; while every GPU is held by a running cell (the default: one cell
per GPU) it waits for one to be freed, which is exactly when the next cell's own actor would start:
nothing overlaps. Where a GPU is free (`max_concurrent` below the GPU count) the spare would hold a
GPU that no cell measures on, hiding it from everyone else on the cluster. And with forking (the
default) a spare has nothing to prepare: the template imported everything, the fork takes 0.03 s,
and CUDA can only be initialised in the cell's own forked process, once its actor holds the GPU.

CPUs: `Limits.needs.cpus` of 0 (`ray.cpus_per_cell=0`, auto) is resolved here against the cluster
(`driver/cell_resources.py`), and each cell is told the result so that its torch threads match it
(`cell/threads.py`).

Placement: every cell's timeout counts from when Ray has placed its actor and the actor is up (its
`ready()` has answered), not while it waits for resources. An actor Ray has not placed is given up
as `timeout` (retried like any) once `cell_timeout_s` passes in which no cell of this sweep was
placed or ended: each of ours is killed at its own timeout, so any placed before that window would
have ended by then; what it waits for is held by another job, or the node that had it left.

Host memory: a job with predicted pinned host memory (an offloaded cache, `Job.host_memory_bytes`)
has its actor reserve that much of Ray's `memory` resource (`cell_resources.memory_ask`), so a node
runs at once only the offloaded cells whose pinned blocks fit it; the next waits for Ray to place it.
One such job waits at a time (the queue's other memory jobs keep their order behind it). It holds one
of `max_concurrent`'s places for `placing_grace_s` (an actor whose resources are free is up by then),
and again for as long after each cell of this sweep ends (what it waits for may be free now); else
it holds nothing, and the queue's next jobs that ask no memory run in its place, so no GPU idles
behind it. GPU cells never outnumber the GPUs: each actor asks Ray for its GPUs. If memory is freed by
something other than a cell of this sweep ending, the waiting cell may run beside `max_concurrent`
others: one more cell than that, and only while GPUs are free for it.
"""

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from kvsweep.cell.actor import RUNNER_MODULE, CellActor, CellProcessDied
from kvsweep.driver.cell_resources import memory_ask, spares_wanted, with_cpus_resolved
from kvsweep.driver.ray_session import CellNeeds
from kvsweep.driver.templates import Templates
from kvsweep.errors import first_line
from kvsweep.grid import Cell
from kvsweep.names import ResultTag
from kvsweep.results import CRASHED, ERROR, OOM, RETRIED_STATUSES, TIMEOUT, CellResult
from kvsweep.units import GB

POLL_S = 0.5


@dataclass(frozen=True)
class Limits:
    needs: CellNeeds
    max_concurrent: int
    cell_timeout_s: float
    max_retries: int
    prestart: int = 0  # spare actors prepared ahead of need (CPU cells only; see the module docstring)
    placing_grace_s: float = 10.0  # a memory job unplaced this long waits for memory (see the module docstring)


@dataclass
class Job:
    cell_id: str
    cell: Cell
    attempt: int = 1
    host_memory_bytes: int = 0  # pinned host memory the plan predicts (offloaded caches): reserved from Ray


@dataclass
class _Running:
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


@dataclass(frozen=True)
class _Hooks:
    """What `run` tells its caller: see `CellScheduler.run`."""

    on_result: Callable[[CellResult], None]
    on_start: Callable[[Job], None]
    admit: Callable[[Job], CellResult | None]
    on_wait: Callable[[Job, str], None]


@dataclass
class _Spare:
    actor: Any
    ready: Any  # ObjectRef of `ready()`: resolves once the spare has imported, fails if it died


class CellScheduler:
    def __init__(
        self,
        protocol: dict[str, Any],
        limits: Limits,
        testing: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
        templates: Templates | None = None,
    ) -> None:
        """`options` are `run_cell`'s keyword arguments (trust_remote_code, wait_idle_gpu_s, strategies);
        `cpus_per_cell` is added here."""
        self.protocol = protocol
        self.nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.needs = with_cpus_resolved(limits.needs, self.nodes)
        self.limits = replace(limits, needs=self.needs)
        self.testing = testing or {}
        self.options = {**(options or {}), "cpus_per_cell": self.needs.cpus}
        self.running: dict[Any, _Running] = {}
        self.ended_at = -math.inf  # when a cell of this sweep last ended (freeing what it held)
        self.changed_at = -math.inf  # when a cell of this sweep last was placed or ended
        self.spares: deque[_Spare] = deque()
        self.prestart = spares_wanted(limits.prestart, self.needs)
        self.actor_class = ray.remote(max_restarts=0, max_task_retries=0, **self.needs.actor_options())(CellActor)
        runner = self.testing.get("runner") or ""
        self.gated = protocol.get("device", "cpu") == "cpu"  # see the module docstring
        # The handles keep the templates alive (Ray ends an actor when no handle refers to it).
        self.templates = templates  # launched by the driver at connect; None: cells are not forked
        self.template_problem = templates.wait() if templates is not None else ""
        self.forked = templates is not None and not self.template_problem
        # A spare of a forked sweep only starts its (light) process; otherwise it imports the cell code.
        self.prepare_module = "" if self.forked else (runner.partition(":")[0] if runner else RUNNER_MODULE)

    def run(
        self,
        jobs: list[Job],
        on_result: Callable[[CellResult], None],
        on_start: Callable[[Job], None] = lambda job: None,
        admit: Callable[[Job], CellResult | None] = lambda job: None,
        on_wait: Callable[[Job, str], None] = lambda job, text: None,
    ) -> None:
        """`on_start`: a job's actor was made; `admit`: a result for a job without running it, or None;
        `on_wait`: a line to show once a job is left waiting for Ray's memory (and lends its place)."""
        hooks = _Hooks(on_result, on_start, admit, on_wait)
        waiting: deque[Job] = deque(jobs)
        try:
            while waiting or self.running:
                self._start_next(waiting, hooks)
                if not self.running:
                    continue
                ready, _ = ray.wait(list(self.running), num_returns=1, timeout=POLL_S)
                now = time.monotonic()
                self._note_placements(now)
                finished = [(ref, _collect(ref, self.running[ref])) for ref in ready]
                finished += self._overdue(now, ready)
                results = []
                for ref, result in finished:
                    entry = self.running.pop(ref)
                    ray.kill(entry.actor, no_restart=True)  # frees its GPU for the next cell at once
                    if result.status in RETRIED_STATUSES and entry.job.attempt <= self.limits.max_retries:
                        waiting.appendleft(replace(entry.job, attempt=entry.job.attempt + 1))
                        continue
                    results.append(result)
                # The next cells start before the finished ones are logged, unless one is an OOM that
                # `admit` must see first (it may spare larger cells of the same family).
                if results and all(r.status != OOM for r in results):
                    self._start_next(waiting, hooks)
                for result in results:
                    on_result(result)
        finally:
            self._drop_spares()

    def _overdue(self, now: float, ready: list[Any]) -> list[tuple[Any, CellResult]]:
        """Cells past their timeout, then actors Ray has left unplaced past theirs (see the module docstring)."""
        timeout_s = self.limits.cell_timeout_s
        late = [
            (ref, _driver_result(entry, TIMEOUT, f"no result after {timeout_s:g} s; actor killed"))
            for ref, entry in self.running.items()
            if ref not in ready and entry.timed_out(now, timeout_s)
        ]
        if ready or late:
            self.ended_at = self.changed_at = now  # what they held is freed now: the unplaced ones' wait starts again
        unplaced = [
            (ref, _driver_result(entry, TIMEOUT, self._unplaced_message(entry, now)))
            for ref, entry in self.running.items()
            if ref not in ready and entry.placing is not None and now - max(entry.created, self.changed_at) > timeout_s
        ]
        return late + unplaced

    def _unplaced_message(self, entry: _Running, now: float) -> str:
        waited = f"waited {now - entry.created:.0f} s"
        if entry.memory_ask:
            wanted, holder = f"{entry.memory_ask / GB:.1f} GB of Ray memory on a node", "that memory"
        else:
            resources = ", ".join(f"{v:g} {k}" for k, v in self.needs.as_resources().items())
            wanted, holder = f"Ray to place its actor ({resources})", "them"
        return (
            f"{waited} for {wanted}; none freed: no cell of this sweep started or ended in "
            f"{self.limits.cell_timeout_s:g} s (ray.cell_timeout_s), so another job holds {holder} or the node "
            "that had it left; actor killed"
        )

    def _note_placements(self, now: float) -> None:
        """Start the clock of every cell whose actor Ray has placed and that is up since the last look."""
        placing = {entry.placing: entry for entry in self.running.values() if entry.placing is not None}
        if placing:
            placed, _ = ray.wait(list(placing), num_returns=len(placing), timeout=0)
            for ref in placed:
                placing[ref].note_placed(now)
            if placed:
                self.changed_at = now  # what they hold, they hold for their timeout at most

    def _holds_a_place(self, entry: _Running, now: float) -> bool:
        """Whether a cell counts against `max_concurrent`: all but a memory job Ray has kept unplaced past
        `placing_grace_s` since it was made or a cell of this sweep last ended (it holds nothing yet)."""
        if entry.placing is None or not entry.memory_ask:
            return True
        return now - max(entry.created, self.ended_at) <= self.limits.placing_grace_s

    def _start_next(self, waiting: deque[Job], hooks: _Hooks) -> None:
        """Fill free places, then tell MLflow: a free place never waits on the driver's writes."""
        now = time.monotonic()
        self._note_placements(now)
        self._tell_waiting(now, hooks.on_wait)
        taken = sum(self._holds_a_place(entry, now) for entry in self.running.values())
        started: list[Job] = []
        while taken < self.limits.max_concurrent:
            job = self._next_job(waiting)
            if job is None:
                break
            answered = hooks.admit(job)
            if answered is not None:
                hooks.on_result(answered)
                continue
            ask = self._memory_ask(job)
            actor, placing = self._actor(memory=ask)
            ref = actor.run.remote(job.cell.to_dict(), self.protocol, self.testing, self.options, self.forked)
            self.running[ref] = _Running(job, actor, placing, ask)
            taken += 1
            started.append(job)
        self._prestart(len(waiting))
        for job in started:
            hooks.on_start(job)

    def _next_job(self, waiting: deque[Job]) -> Job | None:
        """The queue's first job, taken out of it; while a memory job waits for Ray, the first that asks no
        memory (one memory job waits at a time: the others keep their order behind it)."""
        memory_waiting = any(entry.placing is not None and entry.memory_ask for entry in self.running.values())
        for index, job in enumerate(waiting):
            if not memory_waiting or not self._memory_ask(job):
                del waiting[index]
                return job
        return None

    def _memory_ask(self, job: Job) -> int:
        return memory_ask(job.host_memory_bytes, self.needs, self.nodes)

    def _tell_waiting(self, now: float, on_wait: Callable[[Job, str], None]) -> None:
        """Once per attempt, say which memory job Ray keeps waiting while other cells take its place."""
        for entry in self.running.values():
            if entry.told_waiting or entry.placing is None or self._holds_a_place(entry, now):
                continue
            entry.told_waiting = True
            on_wait(
                entry.job,
                f"{entry.job.cell.label}: waits for {entry.memory_ask / GB:.1f} GB of Ray memory on a node "
                "(its offloaded cache's pinned blocks); cells that ask none run meanwhile; given up after "
                f"{self.limits.cell_timeout_s:g} s (ray.cell_timeout_s) in which no cell of this sweep starts or ends",
            )

    def _actor(self, memory: int = 0) -> tuple[Any, Any]:
        """An actor for the next cell and the ObjectRef of its `ready()` (asked before `run`: an actor runs
        its calls in order). A live spare if there is one (a fresh process that has only imported), else a
        new actor; always a new one to reserve `memory` bytes of Ray's memory (a spare's ask is fixed)."""
        while self.spares and not memory:
            spare = self.spares.popleft()
            done, _ = ray.wait([spare.ready], timeout=0)
            if not done:
                return spare.actor, spare.ready  # still importing or waiting for resources: the cell queues behind
            try:
                ray.get(spare.ready)
                return spare.actor, spare.ready
            except Exception:  # died while idle (e.g. Ray's memory monitor): not this cell's fault
                with contextlib.suppress(Exception):
                    ray.kill(spare.actor, no_restart=True)
        options = {"memory": memory} if memory else {}
        actor = self.actor_class.options(**options).remote("", time.time(), self.gated)
        return actor, actor.ready.remote()

    def _prestart(self, still_waiting: int) -> None:
        while len(self.spares) < min(self.prestart, still_waiting):
            actor = self.actor_class.remote(self.prepare_module, time.time(), self.gated)
            self.spares.append(_Spare(actor, actor.ready.remote()))

    def _drop_spares(self) -> None:
        while self.spares:
            with contextlib.suppress(Exception):
                ray.kill(self.spares.popleft().actor, no_restart=True)

    def kill_all(self) -> list[Job]:
        """Stop every live cell now (Ctrl-C); returns the jobs that were running."""
        jobs = []
        for entry in self.running.values():
            with contextlib.suppress(Exception):  # Ctrl-C in a terminal may have reached Ray's processes too
                ray.kill(entry.actor, no_restart=True)
            jobs.append(entry.job)
        self.running.clear()
        self._drop_spares()
        return jobs


def _collect(ref: Any, entry: _Running) -> CellResult:
    try:
        data = ray.get(ref)
    except ray.exceptions.OutOfMemoryError as exc:
        result = _driver_result(entry, OOM, f"host OOM: Ray's memory monitor killed the cell ({first_line(exc)})")
        result.tags[ResultTag.OOM_KIND] = "host"
        return result
    except ray.exceptions.RayActorError as exc:
        return _driver_result(entry, CRASHED, f"cell process died: {first_line(exc)}")
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, CellProcessDied):  # the forked process ended without a result
            result = _driver_result(entry, OOM if exc.cause.host_oom else CRASHED, str(exc.cause))
            if exc.cause.host_oom:
                result.tags[ResultTag.OOM_KIND] = "host"
            return result
        return _driver_result(entry, ERROR, f"{type(exc.cause).__name__}: {exc.cause}")
    result = CellResult.from_dict(data)
    result.wall_s = time.monotonic() - entry.since
    result.attempt = entry.job.attempt
    return result


def _driver_result(entry: _Running, status: str, message: str) -> CellResult:
    return CellResult(
        entry.job.cell_id,
        entry.job.cell,
        status,
        error=message[:500],
        wall_s=time.monotonic() - entry.since,
        attempt=entry.job.attempt,
    )
