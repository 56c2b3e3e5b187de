"""Build the native extensions runnable cells need, once per node, before any cell is timed.

A build inside a cell would land in its first call (minutes of nvcc, a minute of g++) and make cells starting
together queue on the package's build lock. So each node builds (on CUDA, loads when already built) in a short
Ray task holding what the cells hold (a GPU for CUDA extensions); a failed build turns those cells `skipped` with
the compiler's first error (`build_failure`). On a one-node cluster an extension built for the installed torch is
not touched. Triton's launcher, which Triton builds in a compiled CUDA cell's first call, is checked on each GPU
node the same way (`launcher_problems`): the driver may lack the nodes' compiler, headers or libcuda.
"""

import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray

from kvsweep.caches import get_strategy
from kvsweep.caches.native_build import NativeBuild
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.plan.triton_launcher import launcher_problem

BUILD_TIMEOUT_S = 1800.0  # nvcc over quanto's Marlin kernels takes minutes on a busy node
LAUNCHER_CHECK_TIMEOUT_S = 120.0  # a few file checks and one ldconfig per node, after a worker starts
REASON_CHARS = 300

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_RAY_HEADER = re.compile(r"^ray::\S*\(\) \(pid=\d+")  # the line Ray puts where a remote traceback starts
# gcc/clang "file:1:10: fatal error: ...", nvcc "file(5): error: ...", "nvcc fatal : ...", setuptools "error: ..."
_DIAGNOSTIC = re.compile(r"\b(error|fatal)\s*:", re.IGNORECASE)


def builds_of(planned: PlannedCell, device: str) -> tuple[NativeBuild, ...]:
    return tuple(b for b in get_strategy(planned.cell.cache).requires.native_builds if b.device == device)


def needed_builds(planned: list[PlannedCell], device: str, nodes: list[dict[str, Any]]) -> list[NativeBuild]:
    """The builds runnable cells need on `device`; on one node, only those not built there already."""
    builds = {b.name: b for p in planned if p.runs for b in builds_of(p, device)}
    return [b for b in builds.values() if len(nodes) > 1 or not b.built_for_installed_torch()]


def _build_on_this_node(build: NativeBuild) -> float:
    started = time.monotonic()
    build.build()
    return time.monotonic() - started


def build_failure(exc: BaseException) -> str:
    """Why a build failed, in one line: the compiler's first error, else the first line the build raised.

    A failure inside the Ray task arrives as Ray's wrapper (a coloured `ray::_build_on_this_node()` header and a
    traceback) with the build's exception as its `cause`; torch's build error holds ninja's whole log, where the
    compiler's own `error:` line says what to fix.
    """
    cause = getattr(exc, "cause", None)
    raised = cause if isinstance(cause, BaseException) else exc
    lines = [clean for line in str(raised).splitlines() if (clean := _meaningful(line))]
    diagnostic = next((line for line in lines if _DIAGNOSTIC.search(line)), None)
    return (diagnostic or (lines[0] if lines else type(raised).__name__))[:REASON_CHARS]


def _meaningful(line: str) -> str:
    """The line without colour codes, or "" for Ray's header, traceback frames and indented context."""
    plain = _COLOUR.sub("", line)
    if _RAY_HEADER.match(plain) or plain.startswith(("Traceback (", " ")):
        return ""
    return plain.strip()


def prebuild(planned: list[PlannedCell], device: str, say: Callable[[str], None]) -> list[PlannedCell]:
    """The plan, with cells whose native code cannot be built on the nodes marked skipped: cells whose
    extension failed to build, and compiled CUDA cells where a GPU node lacks Triton's launcher toolchain."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    resource = "GPU" if device == "cuda" else "CPU"
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource, 0) >= 1]
    failed: dict[str, str] = {}
    for build in needed_builds(planned, device, nodes):
        task = ray.remote(num_gpus=1 if device == "cuda" else 0, num_cpus=1, max_retries=0)(_build_on_this_node)
        say(f"building {build.package}'s {device} extension {build.name} on {len(nodes)} node(s) before any cell ...")
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(build)
            for n in nodes
        ]
        try:
            seconds = ray.get(refs, timeout=BUILD_TIMEOUT_S)
            say(f"{build.name} ready in {max(seconds, default=0):.0f} s (outside every cell's numbers)")
        except Exception as exc:  # a compiler error, a timeout: the cells that need it cannot run
            failed[build.name] = f"building {build.name} failed: {build_failure(exc)}"
            say(failed[build.name])
    planned = [
        replace(p, skip_reason=failed[names[0]])
        if p.runs and (names := [b.name for b in builds_of(p, device) if b.name in failed])
        else p
        for p in planned
    ]
    if device == "cuda" and nodes and any(p.runs and p.cell.compile for p in planned):
        planned = skip_compiled(planned, launcher_problems(nodes, say), len(nodes))
    return planned


def _launcher_problem_here(probe: Callable[..., str | None], where: str) -> str | None:
    return probe(where=where)


def launcher_problems(
    nodes: list[dict[str, Any]], say: Callable[[str], None], probe: Callable[..., str | None] = launcher_problem
) -> list[str]:
    """Why Triton could not build its launcher, from each node that says so (each names its node).

    `probe(where=...)` runs on each node (`launcher_problem`: what Triton finds there). A node that
    does not answer in time is left to the check each cell makes on its own node.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_launcher_problem_here)  # a GPU is not needed to look
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            probe, f"node {n['NodeManagerAddress']}"
        )
        for n in nodes
    ]
    try:
        problems = [problem for problem in ray.get(refs, timeout=LAUNCHER_CHECK_TIMEOUT_S) if problem]
    except Exception as exc:  # a node that never started the task: its cells check for themselves
        say(f"Triton's launcher toolchain unchecked on the GPU nodes ({build_failure(exc)}): each compiled cell checks")
        return []
    if problems:
        say(problems[0])
    else:
        say(f"Triton's launcher toolchain (compiled CUDA cells): present on all {len(nodes)} GPU node(s)")
    return problems


def skip_compiled(planned: list[PlannedCell], problems: list[str], nodes: int) -> list[PlannedCell]:
    """Compiled cells that would run, skipped with the first node's reason (a cell may land on any node)."""
    if not problems:
        return planned
    reason = problems[0]
    if len(problems) > 1:
        reason += f" ({len(problems) - 1} more of the {nodes} GPU nodes lack some of it too)"
    return [replace(p, skip_reason=reason) if p.runs and p.cell.compile else p for p in planned]
