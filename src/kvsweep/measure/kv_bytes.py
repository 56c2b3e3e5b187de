"""Bytes held by a cache object that `generate` returned, counted as stored.

Walks each layer's attributes; a tensor subclass (quanto's packed tensors) is opened through
`__tensor_flatten__` down to its plain storage, tuples and dicts (HQQ's payload and metadata) are
walked, and every storage is counted once. Scalar bookkeeping tensors (lengths) are not cache.
"""

from typing import Any

import torch


def cache_bytes(cache: Any) -> int:
    if cache is None:
        return 0
    seen: set[tuple[str, int, int]] = set()
    layers = getattr(cache, "layers", None)
    roots = list(layers) if layers is not None else [cache]
    return sum(_bytes_of(vars(layer), seen, depth=0) for layer in roots)


def _bytes_of(obj: Any, seen: set[tuple[str, int, int]], depth: int) -> int:
    if depth > 8:
        return 0
    if isinstance(obj, torch.Tensor):
        return _tensor_bytes(obj, seen, depth)
    if isinstance(obj, dict):
        return sum(_bytes_of(v, seen, depth + 1) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_bytes_of(v, seen, depth + 1) for v in obj)
    return 0


def _tensor_bytes(tensor: torch.Tensor, seen: set[tuple[str, int, int]], depth: int) -> int:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None and type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        names, _ = flatten()
        return sum(_bytes_of(getattr(tensor, name), seen, depth + 1) for name in names)
    if tensor.device.type == "meta" or tensor.ndim == 0:
        return 0  # 0-d tensors are bookkeeping (lengths, counters), not cached K/V
    storage = tensor.untyped_storage()
    key = (tensor.device.type, tensor.device.index or 0, storage.data_ptr())
    if key in seen:
        return 0
    seen.add(key)
    return storage.nbytes()
