"""Predict a cell's peak device memory from shapes alone, before anything runs.

peak = weights + the KV cache as the strategy keeps it on the device + a working-set allowance.
Weights and KV are exact arithmetic (tests check them against a built model's parameter bytes and
measured `kv_cache_bytes`); the working set is an allowance for prefill activations, the last
token's logits, and the per-layer K/V copies that concatenation and dequantization make.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from kvsweep.caches import CacheStrategy
from kvsweep.caches.layer_tokens import token_bytes, windows
from kvsweep.dtypes import DTYPE_BYTES
from kvsweep.grid import Cell
from kvsweep.models.shape import KvShape
from kvsweep.plan.kv_bytes import cell_device_kv_bytes
from kvsweep.units import GB

# Memory the CUDA context and allocator take outside `max_memory_allocated`; kept free when fitting.
CUDA_CONTEXT_BYTES = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    kv_device_bytes: int
    working_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.weights_bytes + self.kv_device_bytes + self.working_bytes


def estimate_peak(cell: Cell, strategy: CacheStrategy, shape: KvShape, parameters: int) -> MemoryEstimate:
    bytes_per = DTYPE_BYTES[cell.dtype]
    tokens = cell.cached_tokens
    stored = cell_device_kv_bytes(cell, shape)
    one_layer_kv = largest_layer_kv_bytes(shape, tokens, cell.batch_size, cell.dtype)
    rows = cell.batch_size * cell.context_length  # prefill processes every prompt token at once
    activations = rows * (4 * shape.hidden_size + 3 * shape.intermediate_size) * bytes_per
    logits = cell.batch_size * shape.vocab_size * 4 * 2  # last position, upcast to fp32, plus softmax
    working = activations + logits + 2 * one_layer_kv
    if strategy.implementation is None:  # no cache: every step re-runs a prefill of the whole sequence
        working = (
            cell.batch_size
            * (cell.context_length + cell.max_new_tokens)
            * (4 * shape.hidden_size + 3 * shape.intermediate_size)
            * bytes_per
            + logits
            + 2 * one_layer_kv
        )
    return MemoryEstimate(parameters * bytes_per, stored, working)


def largest_layer_kv_bytes(shape: KvShape, tokens: int, batch: int, dtype: str) -> int:
    """The largest one layer's K and V at `tokens` cached tokens (a full-attention layer, if the model has one)."""
    one = token_bytes(shape, batch, dtype)
    return max((one * (tokens if w is None else min(tokens, w)) for w in windows(shape)), default=0)


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
