"""Predict a cell's peak device memory from shapes alone, before anything runs.

peak = weights + the KV cache as the strategy keeps it on the device + a working-set allowance. Weights and KV are
exact arithmetic (tested against a built model's parameter bytes and measured `kv_cache_bytes`); the working set
allows for prefill activations, the last token's logits, and the per-layer K/V copies that concatenation and
dequantization make. A cell over several GPUs is predicted GPU by GPU as `models/sharding.py` splits it; its peak is
the largest GPU's.
"""

import os
from dataclasses import dataclass, replace
from pathlib import Path

from kvsweep.caches import CacheStrategy
from kvsweep.caches.layer_tokens import layer_state_bytes, layer_states, offloads, windowed_kv_bytes, windows
from kvsweep.caches.paged_pool import pool_for
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape
from kvsweep.models.sharding import GpuLoad, LayerCosts, split_layers
from kvsweep.models.weight_layout import Block, WeightLayout
from kvsweep.models.weight_schemes import block_bytes, layout_bytes, weight_scheme
from kvsweep.plan.kv_prediction import cell_device_kv_bytes
from kvsweep.units import DTYPE_BYTES, GB

# Memory the CUDA context and allocator take outside `max_memory_allocated`; kept free when fitting.
CUDA_CONTEXT_BYTES = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int  # all GPUs together
    kv_device_bytes: int  # all GPUs together
    working_bytes: int  # on one GPU: the largest any GPU needs
    per_gpu: tuple[GpuLoad, ...] = ()  # a cell over several GPUs: each one's share; () on one

    @property
    def peak_bytes(self) -> int:
        """The largest one GPU is predicted to reach (the measured `peak_device_mem_bytes` is the same)."""
        if self.per_gpu:
            return max(load.peak_bytes for load in self.per_gpu)
        return self.weights_bytes + self.kv_device_bytes + self.working_bytes


def estimate_peak(
    cell: Cell,
    strategy: CacheStrategy,
    shape: KvShape,
    parameters: int,
    gpus: int = 1,
    layout: WeightLayout | None = None,
) -> MemoryEstimate:
    """One GPU's peak; with `gpus` > 1, each GPU's as `split_layers` places the model (by `layout`, where the
    weights are; None: the parameters spread evenly over the layers, the embeddings before them)."""
    activations, logits = working_set(cell, strategy, shape)
    one_layer_kv = largest_layer_kv_bytes(shape, cell.cached_tokens, cell.batch_size, cell.dtype)
    single = MemoryEstimate(
        weights_bytes(cell, parameters, layout),
        cell_device_kv_bytes(cell, shape),
        activations + logits + 2 * one_layer_kv,
    )
    if gpus <= 1:
        return single
    loads = split_layers(layer_costs(cell, strategy, shape, layout or even_layout(shape, parameters)), gpus)
    return replace(single, working_bytes=max(load.working_bytes for load in loads), per_gpu=loads)


def weights_bytes(cell: Cell, parameters: int, layout: WeightLayout | None) -> int:
    """The weights as the cell loads them: in its dtype, or quantized (`cell.weights`; exact per module where
    the layout is known, else every parameter at the scheme's bits)."""
    scheme = weight_scheme(cell.weights)
    if scheme is None:
        return parameters * DTYPE_BYTES[cell.dtype]
    if layout is None:
        return parameters * scheme.bits // 8
    return layout_bytes(layout, scheme, DTYPE_BYTES[cell.dtype])


def working_set(cell: Cell, strategy: CacheStrategy, shape: KvShape) -> tuple[int, int]:
    """(prefill activations, the last token's logits): what a forward pass needs beside weights and cache."""
    rows = cell.batch_size * cell.context_length  # prefill processes every prompt token at once
    if strategy.implementation is None:  # no cache: every step re-runs a prefill of the whole sequence
        rows = cell.batch_size * (cell.context_length + cell.max_new_tokens)
    activations = rows * (4 * shape.hidden_size + 3 * shape.intermediate_size) * DTYPE_BYTES[cell.dtype]
    if strategy.family == "paged":  # continuous batching preallocates its attention mask beside the pool
        pool = pool_for(strategy, cell.batch_size, cell.context_length, cell.cached_tokens)
        activations += pool.mask_bytes(shape, cell.dtype)
    logits = cell.batch_size * shape.vocab_size * 4 * 2  # last position, upcast to fp32, plus softmax
    return activations, logits


def layer_costs(cell: Cell, strategy: CacheStrategy, shape: KvShape, layout: WeightLayout) -> LayerCosts:
    """The bytes `split_layers` balances, layer by layer, for this cell."""
    bytes_per, scheme = DTYPE_BYTES[cell.dtype], weight_scheme(cell.weights)
    activations, logits = working_set(cell, strategy, shape)
    decoded = cell.max_new_tokens - 1
    states = layer_state_bytes(shape, cell.batch_size, cell.dtype)
    kv, moved = [], []
    for index, window in enumerate(windows(shape)):
        held = strategy.held_bytes(layer_shape(shape, index), cell.batch_size, cell.dtype, cell.context_length, decoded)
        is_moved = offloads(strategy, window)
        kv.append(states[index] if is_moved else held)
        moved.append(held - states[index] if is_moved else 0)
    transient = [2 * b for b in windowed_kv_bytes(shape, cell.cached_tokens, cell.batch_size, cell.dtype)]
    return LayerCosts(
        first=block_bytes(layout.first, scheme, bytes_per),
        last=block_bytes(layout.last, scheme, bytes_per, quantized=False),  # the head stays in the dtype
        weights=tuple(block_bytes(block, scheme, bytes_per) for block in layout.layers),
        kv=tuple(kv),
        moved_kv=tuple(moved),
        device_layers=strategy.device_layers or 0,
        working=activations,
        layer_working=tuple(transient),
        head_working=logits,
        # weights after the layers but no linear among them: the final norm alone, the head tied to the embeddings
        head_on_first=not layout.last.linears and layout.last.elements() > 0,
    )


def layer_shape(shape: KvShape, index: int) -> KvShape:
    """Layer `index` alone, as a one-layer model: what the strategies' byte accounting takes."""
    window, state = windows(shape)[index], layer_states(shape)[index]
    full = window is None and not state
    return replace(
        shape,
        layers=1,
        layer_windows=() if full else (window,),
        state_elements=(state,) if state else (),
    )


def even_layout(shape: KvShape, parameters: int) -> WeightLayout:
    """Where the weights are when only their count is known: the embeddings first, the rest spread evenly
    over the layers (a head is counted as part of the layers, and run on the last GPU: tied or not cannot be told)."""
    embeddings = min(parameters, shape.vocab_size * shape.hidden_size)
    per_layer, rest = divmod(parameters - embeddings, shape.layers)
    return WeightLayout(
        first=Block(other_elements=embeddings + rest),
        layers=tuple(Block(other_elements=per_layer) for _ in range(shape.layers)),
        last=Block(),
    )


def largest_layer_kv_bytes(shape: KvShape, tokens: int, batch: int, dtype: str) -> int:
    """The largest one layer's K and V at `tokens` cached tokens (a full-attention layer, if the model has one)."""
    return max(windowed_kv_bytes(shape, tokens, batch, dtype), default=0)


def fits(estimate: MemoryEstimate, device_bytes: int) -> bool:
    return estimate.peak_bytes + CUDA_CONTEXT_BYTES <= device_bytes


def detect_device_bytes(device: str, configured_gb: float) -> int | None:
    """Smallest GPU a cell may land on: the configured size in GB (1e9 bytes, as the key says: 80 is
    80e9 bytes, less than the 85.5e9 an "80 GB" H100 has), else the smallest local GPU, else unknown."""
    if configured_gb > 0:
        return int(configured_gb * GB)
    if device != "cuda":
        return None
    sizes = local_gpu_bytes()
    return min(sizes) if sizes else None


def local_gpu_bytes() -> list[int]:
    """Memory of each GPU this process may use, through NVML when it is installed: the driver then
    never imports torch or creates a CUDA context of its own on a GPU the cells need."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted = None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
    if wanted is not None and (not wanted or wanted[0].startswith("-")):
        return []  # CUDA's own convention: an empty or negative list hides every GPU
    if wanted is None or all(v.isdigit() for v in wanted):
        try:
            return _nvml_bytes(None if wanted is None else [int(v) for v in wanted])
        except Exception:  # no NVML library or no driver: ask torch, if there is a driver at all
            if not Path("/dev/nvidiactl").exists():
                return []
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]


def _nvml_bytes(indices: list[int] | None) -> list[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        chosen = range(pynvml.nvmlDeviceGetCount()) if indices is None else indices
        return [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total) for i in chosen]
    finally:
        pynvml.nvmlShutdown()
