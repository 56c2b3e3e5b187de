"""Decide, before anything runs, which cells run and why the others are skipped.

Also where the planner expects a capacity search to stop: the largest batch (or context) whose predicted
peak fits a cell's memory. The search starts its probes there and each frontier reports it beside the
measured one, a check of the planner on every device it runs on."""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from kvsweep.caches import get_strategy
from kvsweep.caches.layer_tokens import quantized_layers_problem
from kvsweep.caches.native_build import Toolchain, build_problem
from kvsweep.capacity.frontier import FrontierKey
from kvsweep.grid import Cell
from kvsweep.models.facts import ModelFacts
from kvsweep.models.shape import KvShape
from kvsweep.models.weight_layout import WeightLayout
from kvsweep.models.weight_schemes import scheme_problem
from kvsweep.plan.kv_prediction import cell_dense_kv_bytes, cell_returned_device_kv_bytes, cell_stored_kv_bytes
from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES, MemoryEstimate, estimate_peak, fits
from kvsweep.plan.offload import HostLimits, OffloadEstimate, estimate_offload, offload_problem
from kvsweep.plan.triton_launcher import launcher_problem
from kvsweep.units import GB


@dataclass(frozen=True)
class PlannedCell:
    cell: Cell
    skip_reason: str | None  # None: run it
    kv_dense_bytes: int | None = None
    kv_stored_bytes: int | None = None
    memory: MemoryEstimate | None = None  # predicted device memory (when the model's size is known)
    offload: OffloadEstimate | None = None  # offloaded caches on CUDA: host memory and transfer time
    kv_device_bytes: int | None = None  # of kv_stored_bytes, those on the device when `generate` returns

    @property
    def runs(self) -> bool:
        return self.skip_reason is None


def package_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def plan_cell(
    cell: Cell,
    device: str,
    shape: KvShape | None,
    is_installed: Callable[[str], bool] = package_installed,
    parameters: int | None = None,
    device_bytes: int | None = None,
    skip_predicted_oom: bool = True,
    toolchain: Toolchain | None = None,
    host: HostLimits | None = None,
    launcher: Callable[[], str | None] | None = None,
    gpus: int = 1,
    layout: WeightLayout | None = None,
) -> PlannedCell:
    """`shape` is None when the model's config could not be read here (the runner reports why).

    A CUDA cell predicted not to fit the smallest GPU is planned as skipped (unless `skip_predicted_oom` is off);
    with `gpus` > 1 the fullest GPU of the split must fit. Triton's launcher is judged only through `launcher`:
    the plan is made on the driver, not where cells run.
    """
    strategy = get_strategy(cell.cache)
    dense = stored = on_device = memory = None
    if shape is not None:
        dense = cell_dense_kv_bytes(cell, shape)
        stored = cell_stored_kv_bytes(cell, shape)
        on_device = cell_returned_device_kv_bytes(cell, shape)
    split = gpus if device == "cuda" else 1
    reason = skip_reason(cell, device, shape, is_installed, toolchain, launcher)
    if reason is None and shape is not None and split > shape.layers:
        reason = (
            f"{shape.layers} decoder layers cannot be split over {split} GPUs (ray.gpus_per_cell): one each at least"
        )
    if reason is None and cell.compile and split > 1:
        reason = compiled_split_problem(split)
    if shape is not None and parameters is not None and split <= shape.layers:
        memory = estimate_peak(cell, strategy, shape, parameters, split, layout)
    gpu_known = device == "cuda" and bool(device_bytes) and skip_predicted_oom
    if reason is None and memory is not None and gpu_known and not fits(memory, device_bytes or 0):
        where = f" on the fullest of {len(memory.per_gpu)} GPUs" if memory.per_gpu else ""
        reason = (
            f"predicted oom: needs {memory.peak_bytes / GB:.1f} GB{where} "
            f"(+{CUDA_CONTEXT_BYTES / GB:.1f} GB CUDA context) of {(device_bytes or 0) / GB:.1f} GB"
        )
    offload = None
    if device == "cuda" and shape is not None and host is not None:
        offload = estimate_offload(cell, strategy, shape, host.link_gbps, host.protocol)
        if reason is None and offload is not None and skip_predicted_oom:
            reason = offload_problem(offload, host.timeout_s, host.memory_bytes)
    return PlannedCell(cell, reason, dense, stored, memory, offload, on_device)


def compiled_split_problem(gpus: int) -> str:
    """A compiled cell over several GPUs could only fail: Inductor refuses CUDA graphs for a graph whose tensors
    span devices (it counts a skip), and a compiled cell without its CUDA graphs fails its check after paying
    for the compile and the measuring. Planned as skipped instead, before any GPU time is spent."""
    return (
        f"compile=true over {gpus} GPUs (ray.gpus_per_cell): Inductor records no CUDA graph spanning devices, "
        "so the compiled cell could only fail its CUDA-graph check; compile runs with ray.gpus_per_cell=1"
    )


def skip_reason(
    cell: Cell,
    device: str,
    shape: KvShape | None,
    is_installed: Callable[[str], bool],
    toolchain: Toolchain | None = None,  # what builds native extensions here; None: look on this machine
    # why Triton could not build its launcher where this runs (`launcher_problem`: look on this
    # machine, as a cell does on its node); None: not judged (a GPU node is asked before cells run)
    launcher: Callable[[], str | None] | None = launcher_problem,
) -> str | None:
    strategy = get_strategy(cell.cache)
    needs = strategy.requires
    if needs.cuda and device != "cuda":
        return f"{strategy.base_name} needs CUDA; cells run on {device}"
    if needs.package and not is_installed(needs.package):
        return f"{strategy.name} needs the '{needs.package}' package ({needs.install_hint()})"
    if problem := scheme_problem(cell.weights, device, is_installed, cell.dtype):
        return problem
    for build in (b for b in needs.native_builds if b.device == device):
        if problem := build_problem(build, toolchain):
            return problem
    if cell.compile and device == "cuda" and launcher is not None and (problem := launcher()):
        return problem
    if shape is not None and shape.max_positions is not None:
        needed = max(cell.context_length + cell.max_new_tokens, strategy.reserve_tokens or 0)
        if needed > shape.max_positions:
            return f"needs {needed} positions; {cell.model} has {shape.max_positions}"
    if shape is not None:  # what the cache's backend would refuse, found before it fails inside generate
        request = (shape, cell.batch_size, cell.context_length, cell.max_new_tokens)
        return quantized_layers_problem(strategy, *request) or strategy.request_problem(*request)
    return None


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
