"""What a built model's weights really occupy, counted from its tensors' storages: the figure a cell records
(`weights_bytes`), the bytes a decode step reads (`measure/decode_bound.py`), and the check on the byte formulas
of `weight_bytes.py`.
"""

from collections.abc import Iterator
from typing import Any


def stored_bytes(model: Any) -> int:
    """The bytes a built model's parameters and persistent buffers occupy (what a checkpoint of it holds; not
    rotary tables), counted from their storages: a quantized tensor's inner tensors (quanto's data, scales, shifts;
    torchao's qdata, scale_and_zero), a bitsandbytes weight's quant state (absmax, code) or row scales (SCB).
    A storage shared by several tensors (tied weights) counts once; a storage larger than its view counts whole."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in _model_tensors(model):
        for leaf in _leaves(tensor):
            key = (str(leaf.device), leaf.untyped_storage().data_ptr() if leaf.device.type != "meta" else id(leaf))
            if key in seen or leaf.numel() == 0:
                continue
            seen.add(key)
            meta = leaf.device.type == "meta"
            total += leaf.numel() * leaf.element_size() if meta else leaf.untyped_storage().nbytes()
    return total


def _model_tensors(model: Any) -> Iterator[Any]:
    for module in model.modules():
        yield from (p for p in module._parameters.values() if p is not None)
        persistent = (b for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set)
        yield from (b for b in persistent if b is not None)


def _leaves(tensor: Any) -> Iterator[Any]:
    """The plain tensors holding `tensor`'s data: itself, or a wrapper subclass's inner tensors, recursively, and
    the tensors bitsandbytes keeps beside a quantized weight."""
    import torch

    state, scb = getattr(tensor, "quant_state", None), getattr(tensor, "SCB", None)
    if state is not None or isinstance(scb, torch.Tensor):  # bitsandbytes: Params4bit, Int8Params
        yield tensor.data
        yield from _state_tensors(state)  # 4-bit: absmax and code
        if isinstance(scb, torch.Tensor):
            yield scb  # int8: a float32 scale per output row
        return
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if inner is not None:
                yield from _leaves(inner)
        return
    yield tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor


def _state_tensors(state: Any) -> Iterator[Any]:
    """A bitsandbytes QuantState's tensors (absmax, code, offset), its nested state's too (double quantization)."""
    import torch

    if state is None:
        return
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value) is type(state):
            yield from _state_tensors(value)
