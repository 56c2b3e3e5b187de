"""Run cells on Ray: one fresh actor per cell, bounded concurrency, timeouts, crash retries.

Results stream back in completion order through `on_result`. Ray's own retries are off (a Ray retry
would re-run work in a new process behind our back); the driver retries crashed cells itself.
"""

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from kvsweep.results import CRASHED, ERROR, OOM, TIMEOUT, CellResult

POLL_S = 0.5


class CellActor:
    """Lives for exactly one cell so that nothing (memory, compiled graphs, threads) leaks between cells."""

    def run(self, cell: dict, protocol: dict, faults: list, trust_remote_code: bool) -> dict:
        from kvsweep.runner import run_cell

        result = run_cell(cell, protocol, faults, trust_remote_code)
        context = ray.get_runtime_context()
        result["environment"]["ray_node_id"] = context.get_node_id()
        result["environment"]["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        return result


@dataclass(frozen=True)
class Limits:
    gpus_per_cell: int
    cpus_per_cell: int
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


def run_cells(
    jobs: list[Job],
    protocol: dict[str, Any],
    limits: Limits,
    on_result: Callable[[CellResult], None],
    on_start: Callable[[Job], None] = lambda job: None,
    faults: list[dict[str, Any]] | None = None,
    trust_remote_code: bool = False,
) -> None:
    use_gpus = protocol["device"] == "cuda"
    actor_class = ray.remote(
        num_cpus=limits.cpus_per_cell,
        num_gpus=limits.gpus_per_cell if use_gpus else 0,
        max_restarts=0,
        max_task_retries=0,
    )(CellActor)
    waiting: deque[Job] = deque(jobs)
    running: dict[Any, _Running] = {}
    while waiting or running:
        while waiting and len(running) < limits.max_concurrent:
            job = waiting.popleft()
            actor = actor_class.remote()
            ref = actor.run.remote(job.cell, protocol, faults or [], trust_remote_code)
            running[ref] = _Running(job, actor)
            on_start(job)
        ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
        for ref in ready:
            entry = running.pop(ref)
            result = _collect(ref, entry)
            ray.kill(entry.actor, no_restart=True)
            if result.status == CRASHED and entry.job.attempt <= limits.max_retries:
                waiting.appendleft(Job(entry.job.cell_id, entry.job.cell, entry.job.attempt + 1))
                continue
            on_result(result)
        now = time.monotonic()
        for ref, entry in list(running.items()):
            if now - entry.started > limits.cell_timeout_s:
                ray.kill(entry.actor, no_restart=True)
                running.pop(ref)
                on_result(_driver_result(entry, TIMEOUT, f"no result after {limits.cell_timeout_s:g} s; actor killed"))


def _collect(ref: Any, entry: _Running) -> CellResult:
    try:
        data = ray.get(ref)
    except ray.exceptions.OutOfMemoryError as exc:
        return _driver_result(entry, OOM, f"host OOM: Ray's memory monitor killed the cell ({_first_line(exc)})")
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
