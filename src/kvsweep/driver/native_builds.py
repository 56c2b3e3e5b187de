"""Build the native extensions runnable cells need, once per GPU node, before any cell is timed.

A build inside a cell would land in its first call (minutes of nvcc) and, with several cells
starting together, make them queue on the package's build lock. Here each GPU node builds (or just
loads, when already built) in a short Ray task holding one GPU; a node whose build fails turns its
cells into `skipped` with the compiler's first line, so nothing runs into it blind.
"""

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray

from kvsweep.caches import get_strategy
from kvsweep.caches.native_build import NativeBuild
from kvsweep.errors import first_line
from kvsweep.plan.cell_plan import PlannedCell

BUILD_TIMEOUT_S = 1800.0  # nvcc over quanto's Marlin kernels takes minutes on a busy node


def needed_builds(planned: list[PlannedCell], device: str) -> dict[str, NativeBuild]:
    if device != "cuda":
        return {}
    builds = (get_strategy(p.cell.cache).requires.cuda_build for p in planned if p.runs)
    return {b.name: b for b in builds if b is not None}


def _build_on_this_node(build: NativeBuild) -> float:
    started = time.monotonic()
    build.build()
    return time.monotonic() - started


def prebuild(planned: list[PlannedCell], device: str, say: Callable[[str], None]) -> list[PlannedCell]:
    """The plan, with cells whose extension failed to build marked skipped."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    failed: dict[str, str] = {}
    for build in needed_builds(planned, device).values():
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]
        task = ray.remote(num_gpus=1, num_cpus=1, max_retries=0)(_build_on_this_node)
        say(f"building {build.package}'s CUDA extension {build.name} on {len(nodes)} node(s) before any cell ...")
        refs: list[Any] = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(build)
            for node in nodes
        ]
        try:
            seconds = ray.get(refs, timeout=BUILD_TIMEOUT_S)
            say(f"{build.name} ready in {max(seconds, default=0):.0f} s (outside every cell's numbers)")
        except Exception as exc:  # a compiler error, a timeout: the cells that need it cannot run
            failed[build.name] = f"building {build.name} failed: {first_line(exc)}"
            say(failed[build.name])
    if not failed:
        return planned
    return [
        replace(p, skip_reason=failed[b.name])
        if p.runs and (b := get_strategy(p.cell.cache).requires.cuda_build) and b.name in failed
        else p
        for p in planned
    ]
