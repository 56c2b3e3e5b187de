"""Which of a cell's devices runs which decoder layers: the planner's split, made again where the cell runs.

A cell with several GPUs splits its model with `plan/sharding.split_layers` on the same bytes the planner
balanced (the layout from a meta-device build of the model, its cache layers from its config), so the
placement is the one the plan predicted, and records it beside what it measured.
"""

from typing import Any

import torch

from kvsweep.caches import get_strategy
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.device_map import Split
from kvsweep.models.resolve import ModelRef, kv_shape, load_config, weight_layout
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
