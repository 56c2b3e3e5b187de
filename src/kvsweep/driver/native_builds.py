"""Build the native extensions runnable cells need, once per node, before any cell is timed.

A build inside a cell would land in its first call (minutes of nvcc, a minute of g++) and, with
several cells starting together, make them queue on the package's build lock. Here each node that
runs such cells builds (or, on CUDA, just loads when already built) in a short Ray task holding what
the cells hold (a GPU for CUDA extensions); a failed build turns those cells into `skipped` with the
compiler's first line, so nothing runs into it blind. On a one-node cluster an extension already
built for the installed torch is not touched.
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


def prebuild(planned: list[PlannedCell], device: str, say: Callable[[str], None]) -> list[PlannedCell]:
    """The plan, with cells whose extension failed to build marked skipped."""
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
            failed[build.name] = f"building {build.name} failed: {first_line(exc)}"
            say(failed[build.name])
    if not failed:
        return planned
    return [
        replace(p, skip_reason=failed[names[0]])
        if p.runs and (names := [b.name for b in builds_of(p, device) if b.name in failed])
        else p
        for p in planned
    ]
