"""Bytes held by a cache object that `generate` returned, counted as stored.

Walks each layer's attributes; a tensor subclass (quanto's packed tensors) is opened through
`__tensor_flatten__` down to its plain storage, tuples and dicts (HQQ's payload and metadata) are
walked, and every storage is counted once. Scalar bookkeeping tensors (lengths) are not cache.
Bytes are split by where they live, so an offloaded cache reports its device and host parts.
"""

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class KvBytes:
    """A cache's bytes by where they are: the cell's device, and host memory (offloaded layers)."""

    device: int = 0
    host: int = 0

    @property
    def total(self) -> int:
        return self.device + self.host


def cache_bytes(cache: Any, device: str = "cpu") -> KvBytes:
    """On a CPU cell the host is the device: everything counts as device bytes there."""
    if cache is None:
        return KvBytes()
    seen: dict[tuple[str, int, int], int] = {}
    layers = getattr(cache, "layers", None)
    for layer in list(layers) if layers is not None else [cache]:
        _collect(vars(layer), seen, depth=0)
    host = sum(n for (kind, _, _), n in seen.items() if kind == "cpu") if device != "cpu" else 0
    return KvBytes(sum(seen.values()) - host, host)


def _collect(obj: Any, seen: dict[tuple[str, int, int], int], depth: int) -> None:
    if depth > 8:
        return
    if isinstance(obj, torch.Tensor):
        _collect_tensor(obj, seen, depth)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, seen, depth + 1)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _collect(v, seen, depth + 1)


def _collect_tensor(tensor: torch.Tensor, seen: dict[tuple[str, int, int], int], depth: int) -> None:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None and type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        names, _ = flatten()
        for name in names:
            _collect(getattr(tensor, name), seen, depth + 1)
        return
    if tensor.device.type == "meta" or tensor.ndim == 0:
        return  # 0-d tensors are bookkeeping (lengths, counters), not cached K/V
    storage = tensor.untyped_storage()
    seen[(tensor.device.type, tensor.device.index or 0, storage.data_ptr())] = storage.nbytes()  # once each
