"""Where the planner expects a capacity search to stop: the largest batch (or context) whose predicted
peak fits the memory a cell is given. The search starts its probes there, and each frontier reports it
beside the measured one: a check of the planner on every device it runs on.
"""

from collections.abc import Callable

from kvsweep.caches import get_strategy
from kvsweep.capacity.frontier import FrontierKey
from kvsweep.grid import Cell
from kvsweep.models.facts import ModelFacts
from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES, estimate_peak
from kvsweep.units import GB


def memory_budget(device: str, device_bytes: int | None, limit_gb: float) -> int | None:
    """Bytes a cell's predicted peak may take: on CUDA the device less CUDA's context (`plan_limits` has
    already put `measure.device_memory_limit_gb` there); on the CPU only that limit (without it the host
    is not a budget to plan to)."""
    if device == "cuda":
        return device_bytes - CUDA_CONTEXT_BYTES if device_bytes else None
    return int(limit_gb * GB) if limit_gb > 0 else None


def predicted_boundary(
    key: FrontierKey,
    facts: ModelFacts | None,
    budget: int | None,
    top: int,
    step: int,
    host_allows: Callable[[Cell], bool] = lambda cell: True,
    gpus: int = 1,
) -> int | None:
    """The largest value (a batch, or a context in multiples of `step`) up to `top` whose predicted peak fits
    `budget` and that `host_allows` (an offloaded cache's pinned blocks and link time); 0 when not even the
    smallest does; None when it cannot be predicted (no budget, unknown size). `gpus`: the GPUs each cell's
    model is split over (the fullest one must fit)."""
    if budget is None or facts is None or facts.planned_parameters is None or gpus > facts.shape.layers:
        return None
    strategy, parameters, shape = get_strategy(key.cache), facts.planned_parameters, facts.shape

    def fits(value: int) -> bool:
        cell = key.cell(value * step)
        peak = estimate_peak(cell, strategy, shape, parameters, gpus, facts.layout).peak_bytes
        return peak <= budget and host_allows(cell)

    return _largest(fits, top // step) * step


def _largest(fits: Callable[[int], bool], top: int) -> int:
    """The largest v in 1..top with fits(v), for a `fits` that holds up to some value and fails after; 0: none."""
    low, high = 0, top + 1  # fits(low) holds (or low = 0), fits(high) fails (or high = top + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def predicted_step_bytes(
    key: FrontierKey, facts: ModelFacts | None, step: int, gpus: int = 1
) -> Callable[[int], float | None]:
    """The planner's peak growth from one value to the next (bytes per batch row, or per `step` of context):
    the slope a search draws through its first memory reading (of the fullest GPU, over `gpus`)."""

    def slope(value: int) -> float | None:
        if facts is None or facts.planned_parameters is None or gpus > facts.shape.layers:
            return None
        strategy, shape, parameters = get_strategy(key.cache), facts.shape, facts.planned_parameters
        low, high = (
            estimate_peak(key.cell(v * step), strategy, shape, parameters, gpus, facts.layout).peak_bytes
            for v in (value, value + 1)
        )
        return float(high - low)

    return slope
