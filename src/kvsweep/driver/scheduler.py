"""Run cells on Ray: one fresh actor per cell, bounded concurrency, timeouts, retries in the driver.

Results stream back in completion order through `on_result`. Ray's own retries are off (they would re-run work
in a new process behind our back); the driver retries crashed and timed-out cells itself, each in a fresh actor.
`admit` may answer for a cell without running it (inferred OOM).

Forking, spares and why GPU cells get none: docs/cluster.md. With forking each cell's measurement runs in a process
forked from its node's `CellTemplate` (`cell/actor.py`), awaited here before the first cell. A spare (CPU cells
only) imports under the host's gate (exclusive) while a measured phase holds it shared, so no spare prepares while
a cell on this host is measured. CPUs of `ray.cpus_per_cell=0` and placement: `driver/actor_placement.py`.
"""

import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray

from kvsweep.cell.actor import RUNNER_MODULE, CellActor, CellProcessDied
from kvsweep.cell.request import CellRequest, RunOptions
from kvsweep.driver.actor_placement import (
    Job,
    Placement,
    Running,
    Templates,
    memory_ask,
    spares_wanted,
    with_cpus_resolved,
)
from kvsweep.driver.ray_session import CellNeeds
from kvsweep.errors import first_line
from kvsweep.grid import MeasureProtocol
from kvsweep.names import ResultTag
from kvsweep.results import CRASHED, ERROR, OOM, RETRIED_STATUSES, TIMEOUT, CellResult
from kvsweep.testing.testing_config import Seams

POLL_S = 0.5


@dataclass(frozen=True)
class Limits:
    needs: CellNeeds
    max_concurrent: int
    cell_timeout_s: float
    max_retries: int
    prestart: int = 0  # spare actors prepared ahead of need (CPU cells only; see the module docstring)
    placing_grace_s: float = 10.0  # a memory job unplaced this long lends its place (`driver/actor_placement.py`)


@dataclass(frozen=True)
class _Hooks:
    """What `run` tells its caller: see `CellScheduler.run`."""

    on_result: Callable[[CellResult], None]
    on_start: Callable[[Job], None]
    admit: Callable[[Job], CellResult | None]
    on_wait: Callable[[Job, str], None]
    follow_up: Callable[[CellResult], list[Job]]


@dataclass
class _Spare:
    actor: Any
    ready: Any  # ObjectRef of `ready()`: resolves once the spare has imported, fails if it died


class CellScheduler:
    def __init__(
        self,
        protocol: MeasureProtocol,
        limits: Limits,
        seams: Seams | None = None,
        options: RunOptions | None = None,
        templates: Templates | None = None,
    ) -> None:
        """Each job becomes a `CellRequest`: its cell, `protocol`, `options` (with the CPUs Ray reserves for a
        cell, resolved here) and the test `seams`."""
        self.protocol = protocol
        self.nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.needs = with_cpus_resolved(limits.needs, self.nodes)
        self.limits = replace(limits, needs=self.needs)
        self.seams = seams or Seams()
        self.options = replace(options or RunOptions(), cpus_per_cell=self.needs.cpus)
        self.running: dict[Any, Running] = {}
        self.placement = Placement(limits.cell_timeout_s, limits.placing_grace_s)
        self.spares: deque[_Spare] = deque()
        self.prestart = spares_wanted(limits.prestart, self.needs)
        self.actor_class = ray.remote(max_restarts=0, max_task_retries=0, **self.needs.actor_options())(CellActor)
        runner = self.seams.runner
        self.gated = protocol.device == "cpu"  # see the module docstring
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
        follow_up: Callable[[CellResult], list[Job]] = lambda result: [],
    ) -> None:
        """`on_start`: a job's actor was made; `admit`: a result for a job without running it, or None;
        `on_wait`: a line to show once a job is left waiting for Ray's memory (and lends its place);
        `follow_up`: the jobs a result calls for (a capacity search's next probe), queued behind the rest."""
        hooks = _Hooks(on_result, on_start, admit, on_wait, follow_up)
        waiting: deque[Job] = deque(jobs)
        try:
            while waiting or self.running:
                self._start_next(waiting, hooks)
                if not self.running:
                    continue
                ready, _ = ray.wait(list(self.running), num_returns=1, timeout=POLL_S)
                now = time.monotonic()
                self.placement.look(self.running.values(), now)
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
                    waiting.extend(follow_up(result))
        finally:
            self._drop_spares()

    def _overdue(self, now: float, ready: list[Any]) -> list[tuple[Any, CellResult]]:
        """Cells past their timeout, then actors Ray has left unplaced past theirs (`driver/actor_placement.py`)."""
        timeout_s = self.limits.cell_timeout_s
        late = [
            (ref, _driver_result(entry, TIMEOUT, f"no result after {timeout_s:g} s; actor killed"))
            for ref, entry in self.running.items()
            if ref not in ready and entry.timed_out(now, timeout_s)
        ]
        if ready or late:
            self.placement.cells_ended(now)
        resources = self.needs.as_resources()
        unplaced = [
            (ref, _driver_result(entry, TIMEOUT, self.placement.given_up_message(entry, now, resources)))
            for ref, entry in self.running.items()
            if ref not in ready and self.placement.given_up(entry, now)
        ]
        return late + unplaced

    def _start_next(self, waiting: deque[Job], hooks: _Hooks) -> None:
        """Fill free places, then tell MLflow: a free place never waits on the driver's writes."""
        now = time.monotonic()
        self.placement.look(self.running.values(), now)
        for job, line in self.placement.newly_waiting(self.running.values(), now):
            hooks.on_wait(job, line)
        taken = sum(self.placement.holds_a_place(entry, now) for entry in self.running.values())
        started: list[Job] = []
        while taken < self.limits.max_concurrent:
            job = self.placement.next_job(waiting, self.running.values(), self._memory_ask)
            if job is None:
                break
            answered = hooks.admit(job)
            if answered is not None:
                hooks.on_result(answered)
                waiting.extend(hooks.follow_up(answered))
                continue
            ask = self._memory_ask(job)
            actor, placing = self._actor(memory=ask)
            request = CellRequest(job.cell, self.protocol, self.options, self.seams)
            ref = actor.run.remote(request, self.forked)
            self.running[ref] = Running(job, actor, placing, ask)
            taken += 1
            started.append(job)
        self._prestart(len(waiting))
        for job in started:
            hooks.on_start(job)

    def _memory_ask(self, job: Job) -> int:
        return memory_ask(job.host_memory_bytes, self.needs, self.nodes)

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


def _collect(ref: Any, entry: Running) -> CellResult:
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


def _driver_result(entry: Running, status: str, message: str) -> CellResult:
    return CellResult(
        entry.job.cell_id,
        entry.job.cell,
        status,
        error=message[:500],
        wall_s=time.monotonic() - entry.since,
        attempt=entry.job.attempt,
    )


def max_concurrent(
    configured: int, device: str, gpus: float, gpus_per_cell: int, node_gpus: Sequence[float] = ()
) -> int:
    """Default: as many cells as fit at once on CUDA; on CPU one at a time so timings do not interfere.
    `ray.max_concurrent` wins when set (a cluster that grows as cells wait: an autoscaler adds nodes)."""
    if configured > 0:
        return configured
    return cells_that_fit(gpus, gpus_per_cell, node_gpus) if device == "cuda" else 1


def cells_that_fit(gpus: float, gpus_per_cell: int, node_gpus: Sequence[float] = ()) -> int:
    """Cells at once on the cluster's GPUs: node by node where the nodes are known (a cell's GPUs are on one
    node: two nodes of 3 GPUs hold two cells of 2, not three), else the total divided."""
    if node_gpus:
        return max(1, sum(int(g // gpus_per_cell) for g in node_gpus))
    return max(1, int(gpus // gpus_per_cell))
