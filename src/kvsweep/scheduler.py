"""Run cells on Ray: one fresh actor per cell, bounded concurrency, timeouts, retries in the driver.

Results stream back in completion order through `on_result`. Ray's own retries are off (a Ray retry
would re-run work in a new process behind our back); the driver retries crashed and timed-out cells
itself, each attempt in a fresh actor. `admit` may answer for a cell without running it (inferred OOM).
"""

import contextlib
import importlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from kvsweep.ray_session import CellNeeds
from kvsweep.results import CRASHED, ERROR, OOM, RETRIED_STATUSES, TIMEOUT, CellResult

POLL_S = 0.5


class CellActor:
    """Lives for exactly one cell so that nothing (memory, compiled graphs, threads) leaks between cells."""

    def run(self, cell: dict, protocol: dict, testing: dict, options: dict) -> dict:
        started_at = time.time()
        if testing.get("runner"):
            module, _, function = testing["runner"].partition(":")
            result = getattr(importlib.import_module(module), function)(cell, protocol, testing)
        else:
            from kvsweep.runner import run_cell

            result = run_cell(cell, protocol, testing.get("faults", []), **options)
        context = ray.get_runtime_context()
        result["environment"].update(
            ray_node_id=context.get_node_id(),
            gpu_ids=",".join(str(g) for g in ray.get_gpu_ids()),
            started_at=started_at,
            ended_at=time.time(),
        )
        return result


@dataclass(frozen=True)
class Limits:
    needs: CellNeeds
    max_concurrent: int
    cell_timeout_s: float
    max_retries: int


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
        self.actor_class = ray.remote(max_restarts=0, max_task_retries=0, **limits.needs.actor_options())(CellActor)

    def run(
        self,
        jobs: list[Job],
        on_result: Callable[[CellResult], None],
        on_start: Callable[[Job], None] = lambda job: None,
        admit: Callable[[Job], CellResult | None] = lambda job: None,
    ) -> None:
        waiting: deque[Job] = deque(jobs)
        while waiting or self.running:
            while waiting and len(self.running) < self.limits.max_concurrent:
                job = waiting.popleft()
                answered = admit(job)
                if answered is not None:
                    on_result(answered)
                    continue
                actor = self.actor_class.remote()
                ref = actor.run.remote(job.cell, self.protocol, self.testing, self.options)
                self.running[ref] = _Running(job, actor)
                on_start(job)
            if not self.running:
                continue
            ready, _ = ray.wait(list(self.running), num_returns=1, timeout=POLL_S)
            finished = [(ref, _collect(ref, self.running[ref])) for ref in ready]
            now = time.monotonic()
            for ref, entry in self.running.items():
                if ref not in ready and now - entry.started > self.limits.cell_timeout_s:
                    message = f"no result after {self.limits.cell_timeout_s:g} s; actor killed"
                    finished.append((ref, _driver_result(entry, TIMEOUT, message)))
            for ref, result in finished:
                entry = self.running.pop(ref)
                ray.kill(entry.actor, no_restart=True)  # frees its GPU for the next cell at once
                if result.status in RETRIED_STATUSES and entry.job.attempt <= self.limits.max_retries:
                    waiting.appendleft(Job(entry.job.cell_id, entry.job.cell, entry.job.attempt + 1))
                    continue
                on_result(result)

    def kill_all(self) -> list[Job]:
        """Stop every live cell now (Ctrl-C); returns the jobs that were running."""
        jobs = []
        for entry in self.running.values():
            with contextlib.suppress(Exception):  # Ctrl-C in a terminal may have reached Ray's processes too
                ray.kill(entry.actor, no_restart=True)
            jobs.append(entry.job)
        self.running.clear()
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
