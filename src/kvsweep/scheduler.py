"""Run cells on Ray: one fresh actor per cell, bounded concurrency, timeouts, retries in the driver.

Results stream back in completion order through `on_result`. Ray's own retries are off (a Ray retry
would re-run work in a new process behind our back); the driver retries crashed and timed-out cells
itself, each attempt in a fresh actor. `admit` may answer for a cell without running it (inferred OOM).

Prestart: up to `prestart` spare actors are created ahead of need. A spare is a fresh process that
has only imported the cell code; the next cell runs in it, so process start and imports overlap the
running cell. For CPU cells the CPU is the measured device: a spare imports under the host's gate
(exclusive lock) and a cell's measured phase holds the gate shared, so no spare is preparing while a
cell on this host is being measured. For GPU cells a spare's imports touch no GPU (torch initialises
CUDA lazily), so they run ungated on the host's other cores; gating them there would starve spares
on a many-GPU host, where some cell is nearly always in its measured phase.
"""

import contextlib
import fcntl
import importlib
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from kvsweep.ray_session import CellNeeds
from kvsweep.results import CRASHED, ERROR, OOM, RETRIED_STATUSES, TIMEOUT, CellResult

POLL_S = 0.5
RUNNER_MODULE = "kvsweep.runner"


class CellActor:
    """Lives for exactly one cell so that nothing (memory, compiled graphs, threads) leaks between cells.

    `prepare` names a module to import now (a spare: the cell comes later); `requested_at` is when the
    driver asked for the actor. Timestamps of every phase go into the result's `environment.timeline`.
    """

    def __init__(self, prepare: str = "", requested_at: float = 0.0, gated: bool = True) -> None:
        self.timeline: dict[str, float] = {"requested_at": requested_at}
        self.timeline["process_started_at"] = process_started_at()
        self.timeline["actor_init_at"] = time.time()
        self._measuring: Any = None
        self._gated = gated
        if prepare:
            with host_gate(exclusive=True) if gated else contextlib.nullcontext():
                self.timeline["prepare_at"] = time.time()
                importlib.import_module(prepare)
            self.timeline["prepared_at"] = time.time()

    def ready(self) -> bool:
        return True

    def run(self, cell: dict, protocol: dict, testing: dict, options: dict) -> dict:
        started_at = time.time()
        self.timeline["run_at"] = started_at
        if testing.get("runner"):
            module, _, function = testing["runner"].partition(":")
            runner = getattr(importlib.import_module(module), function)
            self.timeline["imported_at"] = time.time()
            result = runner(cell, protocol, testing)
        else:
            from kvsweep.runner import run_cell

            self.timeline["imported_at"] = time.time()
            result = run_cell(cell, protocol, testing.get("faults", []), on_phase=self._phase, **options)
        if self._measuring is not None:  # the cell failed inside its measured phase
            self._measuring.__exit__(None, None, None)
        context = ray.get_runtime_context()
        ended_at = time.time()
        self.timeline["returned_at"] = ended_at
        result["environment"].update(
            ray_node_id=context.get_node_id(),
            gpu_ids=",".join(str(g) for g in ray.get_gpu_ids()),
            started_at=started_at,
            ended_at=ended_at,
            timeline={k: round(v, 3) for k, v in self.timeline.items() if v},
        )
        return result

    def _phase(self, name: str) -> None:
        self.timeline[f"{name}_at"] = time.time()
        if name == "measuring" and self._gated:  # wait until no spare imports on this host, then keep them out
            self._measuring = host_gate(exclusive=False)
            self._measuring.__enter__()
            self.timeline["gate_passed_at"] = time.time()
        elif name == "measured" and self._measuring is not None:
            self._measuring.__exit__(None, None, None)
            self._measuring = None


def process_started_at() -> float:
    """Wall-clock start of this process from /proc (psutil's create_time is only good to a second)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@contextlib.contextmanager
def host_gate(exclusive: bool) -> Iterator[None]:
    """The host's preparation gate for this Ray session: spares hold it exclusively, measured phases shared."""
    path = os.path.join(tempfile.gettempdir(), f"kvsweep-gate-{ray.get_runtime_context().get_session_name()}.lock")
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Limits:
    needs: CellNeeds
    max_concurrent: int
    cell_timeout_s: float
    max_retries: int
    prestart: int = 0  # spare actors prepared ahead of need


@dataclass
class Job:
    cell_id: str
    cell: dict[str, Any]
    attempt: int = 1


@dataclass
class _Running:
    job: Job
    actor: Any
    started: float = field(default_factory=time.monotonic)


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
    ) -> None:
        """`options` are `run_cell`'s keyword arguments (trust_remote_code, wait_idle_gpu_s)."""
        self.protocol = protocol
        self.limits = limits
        self.testing = testing or {}
        self.options = options or {}
        self.running: dict[Any, _Running] = {}
        self.spares: deque[_Spare] = deque()
        self.actor_class = ray.remote(max_restarts=0, max_task_retries=0, **limits.needs.actor_options())(CellActor)
        runner = self.testing.get("runner") or ""
        self.prepare_module = runner.partition(":")[0] if runner else RUNNER_MODULE
        self.gated = protocol.get("device", "cpu") == "cpu"  # see the module docstring

    def run(
        self,
        jobs: list[Job],
        on_result: Callable[[CellResult], None],
        on_start: Callable[[Job], None] = lambda job: None,
        admit: Callable[[Job], CellResult | None] = lambda job: None,
    ) -> None:
        waiting: deque[Job] = deque(jobs)
        try:
            while waiting or self.running:
                self._start_next(waiting, on_result, on_start, admit)
                if not self.running:
                    continue
                ready, _ = ray.wait(list(self.running), num_returns=1, timeout=POLL_S)
                finished = [(ref, _collect(ref, self.running[ref])) for ref in ready]
                now = time.monotonic()
                for ref, entry in self.running.items():
                    if ref not in ready and now - entry.started > self.limits.cell_timeout_s:
                        message = f"no result after {self.limits.cell_timeout_s:g} s; actor killed"
                        finished.append((ref, _driver_result(entry, TIMEOUT, message)))
                results = []
                for ref, result in finished:
                    entry = self.running.pop(ref)
                    ray.kill(entry.actor, no_restart=True)  # frees its GPU for the next cell at once
                    if result.status in RETRIED_STATUSES and entry.job.attempt <= self.limits.max_retries:
                        waiting.appendleft(Job(entry.job.cell_id, entry.job.cell, entry.job.attempt + 1))
                        continue
                    results.append(result)
                # The next cells start before the finished ones are logged, unless one is an OOM that
                # `admit` must see first (it may spare larger cells of the same family).
                if results and all(r.status != OOM for r in results):
                    self._start_next(waiting, on_result, on_start, admit)
                for result in results:
                    on_result(result)
        finally:
            self._drop_spares()

    def _start_next(
        self,
        waiting: deque[Job],
        on_result: Callable[[CellResult], None],
        on_start: Callable[[Job], None],
        admit: Callable[[Job], CellResult | None],
    ) -> None:
        """Fill free slots, then tell MLflow: a free slot never waits on the driver's writes."""
        started: list[Job] = []
        while waiting and len(self.running) < self.limits.max_concurrent:
            job = waiting.popleft()
            answered = admit(job)
            if answered is not None:
                on_result(answered)
                continue
            actor = self._actor()
            ref = actor.run.remote(job.cell, self.protocol, self.testing, self.options)
            self.running[ref] = _Running(job, actor)
            started.append(job)
        self._prestart(len(waiting))
        for job in started:
            on_start(job)

    def _actor(self) -> Any:
        """A live spare if there is one (a fresh process that has only imported), else a new actor."""
        while self.spares:
            spare = self.spares.popleft()
            done, _ = ray.wait([spare.ready], timeout=0)
            if not done:
                return spare.actor  # still importing or waiting for resources: the cell queues behind
            try:
                ray.get(spare.ready)
                return spare.actor
            except Exception:  # died while idle (e.g. Ray's memory monitor): not this cell's fault
                with contextlib.suppress(Exception):
                    ray.kill(spare.actor, no_restart=True)
        return self.actor_class.remote("", time.time(), self.gated)

    def _prestart(self, still_waiting: int) -> None:
        while len(self.spares) < min(self.limits.prestart, still_waiting):
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
        result = _driver_result(entry, OOM, f"host OOM: Ray's memory monitor killed the cell ({_first_line(exc)})")
        result.tags["kvsweep.oom_kind"] = "host"
        return result
    except ray.exceptions.RayActorError as exc:
        return _driver_result(entry, CRASHED, f"cell process died: {_first_line(exc)}")
    except ray.exceptions.RayTaskError as exc:
        return _driver_result(entry, ERROR, f"{type(exc.cause).__name__}: {exc.cause}")
    result = CellResult.from_dict(data)
    result.wall_s = time.monotonic() - entry.started
    result.attempt = entry.job.attempt
    return result


def _driver_result(entry: _Running, status: str, message: str) -> CellResult:
    return CellResult(
        entry.job.cell_id,
        entry.job.cell,
        status,
        error=message[:500],
        wall_s=time.monotonic() - entry.started,
        attempt=entry.job.attempt,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
