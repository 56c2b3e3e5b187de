"""Decide, before anything runs, which cells run and why the others are skipped."""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from kvsweep.caches import get_strategy
from kvsweep.caches.layer_tokens import quantized_layers_problem
from kvsweep.caches.native_build import Toolchain, build_problem
from kvsweep.grid import Cell
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

    With the model's parameter count and the smallest GPU's size known, a CUDA cell predicted not to
    fit is planned as skipped (unless `skip_predicted_oom` is off). With `gpus` > 1 the model is split over
    them as the cell will place it (`layout`: where its weights are) and the fullest GPU must fit.
    Triton's launcher toolchain is not judged here unless `launcher` is given: the plan is made on the
    driver, not where cells run.
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
