"""The cell's model on its device or devices, read from where the driver fetched it, or why the cell is
skipped (found before building it, or after, once its shape is known).
"""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch

from kvsweep.cell.split import cell_devices, cell_split
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.build import build_model, torch_dtype_of
from kvsweep.models.device_map import Split, build_split_model
from kvsweep.models.resolve import cached_model, classify, hub_cache_folder, hub_repo, kv_shape
from kvsweep.models.shape import KvShape
from kvsweep.plan.cell_plan import package_installed, skip_reason


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
