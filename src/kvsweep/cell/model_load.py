"""The cell's model on its device or devices, and which device runs which decoder layers.

A cell with several GPUs splits its model with `plan/sharding.split_layers` on the same bytes the planner
balanced (the layout from a meta-device build of the model, its cache layers from its config), so the
placement is the one the plan predicted, and records it beside what it measured. The model is read from
where the driver fetched it; a cell is skipped with the reason found before building it, or after, once
its shape is known.
"""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from kvsweep.caches import get_strategy
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.build import Split, build_model, build_split_model, torch_dtype_of
from kvsweep.models.resolve import (
    ModelRef,
    cached_model,
    classify,
    hub_cache_folder,
    hub_repo,
    kv_shape,
    load_config,
    weight_layout,
)
from kvsweep.models.shape import KvShape
from kvsweep.plan.cell_plan import package_installed, skip_reason
from kvsweep.plan.memory_fit import estimate_peak


def cell_split(cell: Cell, ref: ModelRef, devices: tuple[str, ...], trust_remote_code: bool) -> Split:
    """Which layers each device runs: `split_layers` on the same bytes the planner balanced (the model's
    layout from a meta-device build, its cache layers from its config)."""
    config = load_config(ref, trust_remote_code)
    shape, layout = kv_shape(config), weight_layout(config)
    estimate = estimate_peak(cell, get_strategy(cell.cache), shape, layout.elements(), len(devices), layout)
    return Split(devices, estimate.per_gpu)


def placement_record(split: Split) -> dict[str, Any]:
    """samples.json's account of a split model: each device, its layers and its predicted bytes."""
    return {
        "devices": list(split.devices),
        "layers": [[load.layers.start, load.layers.stop - 1] for load in split.loads],
        "holds_head": [load.holds_head for load in split.loads],
        "predicted_peak_bytes": [load.peak_bytes for load in split.loads],
    }


def cell_devices(protocol: MeasureProtocol, seam_devices: int = 0) -> tuple[str, ...]:
    """The devices a cell places its model over: one `cuda:i` per GPU Ray gave its actor (it sees only
    those), or with the `testing.split_devices` seam that many times the CPU; () for one device."""
    if seam_devices > 1:
        return ("cpu",) * seam_devices
    if protocol.gpus <= 1:
        return ()
    visible = torch.cuda.device_count()
    if visible < protocol.gpus:
        raise RuntimeError(f"cell planned over {protocol.gpus} GPUs, but its worker sees {visible}")
    return tuple(f"cuda:{i}" for i in range(protocol.gpus))


@dataclass(frozen=True)
class Loaded:
    model: torch.nn.Module
    shape: KvShape
    seconds: float  # building it (`model_load_s`)
    split: Split | None = None  # placed over several devices


def fetched_source(cell: Cell, hub_cache: Mapping[str, str]) -> Cell:
    """The cell with its model read from where it lies: a Hub model the driver fetched, as its cached
    snapshot's folder (the weights and tokenizer then load with no request to the Hub); any other as it is."""
    if cell.model not in hub_cache:
        return cell
    snapshot = cached_model(cell.model, hub_cache[cell.model] or None)  # a GGUF model: its file in the snapshot
    if snapshot is None:
        where = hub_cache_folder(hub_repo(cell.model), hub_cache[cell.model] or None)
        raise RuntimeError(f"{cell.model} was fetched before the sweep, but {where} has no snapshot of it on this node")
    return replace(cell, model=str(snapshot))


def load_cell_model(
    cell: Cell,
    protocol: MeasureProtocol,
    trust_remote_code: bool,
    on_phase: Callable[[str], None],
    source: Cell | None = None,
    split_devices: int = 0,
) -> Loaded | str:
    """The cell's model on its device (or its devices), or why the cell is skipped (found before or after
    building it). `source`: the cell with its model where it is read from (`fetched_source`);
    `split_devices`: the seam that splits it over that many CPU devices."""
    device = protocol.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("cell planned for CUDA but this worker has no usable GPU")
    reason = skip_reason(cell, device, None, package_installed)
    if reason is not None:
        return reason
    loaded_at = time.perf_counter()
    ref = classify((source or cell).model)
    devices = cell_devices(protocol, split_devices)
    split = cell_split(cell, ref, devices, trust_remote_code) if devices else None
    if split is not None:
        dtype = torch_dtype_of(cell.dtype)
        model, _ = build_split_model(ref, dtype, protocol.measure.seed, split, trust_remote_code, cell.weights)
    else:
        model = build_model(ref, cell.dtype, device, protocol.measure.seed, trust_remote_code, cell.weights)
    seconds = time.perf_counter() - loaded_at
    on_phase("built")
    shape = kv_shape(model.config)
    reason = skip_reason(cell, device, shape, package_installed)
    return reason if reason is not None else Loaded(model, shape, seconds, split)
