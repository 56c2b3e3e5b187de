"""Which cache `generate` really used, and whether it is the one the strategy names.

Transformers falls back quietly: a model without default-cache support ignores `cache_implementation` with only a
log warning, and `offloaded` is the dynamic cache class with a flag. So every ok cell's returned cache is checked
against the registry; a mismatch is an error, never a number under a wrong name. Its bytes (`cache_bytes`) are
counted as stored: tensor subclasses (quanto's packed tensors) opened through `__tensor_flatten__`, tuples and dicts
(HQQ's payload) walked, each storage counted once, by where it lives (an offloaded cache's device and host parts).
"""

from dataclasses import dataclass
from typing import Any

import torch

from kvsweep.caches import CacheStrategy
from kvsweep.caches.strategy import DEFAULT_AXIS, DEFAULT_GROUP_SIZE, DEFAULT_RESIDUAL_LENGTH

QUANTIZED_SETTINGS = {
    "residual_length": DEFAULT_RESIDUAL_LENGTH,
    "q_group_size": DEFAULT_GROUP_SIZE,
    "axis_key": DEFAULT_AXIS,
    "axis_value": DEFAULT_AXIS,
}


STATE_LAYER_BASE = "LinearAttentionCacheLayerMixin"  # Transformers' base of every fixed-state cache layer


@dataclass(frozen=True)
class CacheIdentity:
    """The facts of a returned cache object that tell strategies apart."""

    cache_classes: tuple[str, ...]  # the object's class and its bases (subclasses still count)
    layer_classes: tuple[tuple[str, ...], ...]  # per layer: its class and its bases
    offloading: bool = False
    max_cache_len: int | None = None  # the longest layer's reserved length (static layouts)
    nbits: int | None = None
    # A quantized layer's settings, as every layer holds them (None: not exposed, or the layers differ)
    residual_length: int | None = None
    q_group_size: int | None = None
    axis_key: int | None = None
    axis_value: int | None = None

    @property
    def tag(self) -> str:
        """`kvsweep.cache_class`: e.g. `StaticCache/StaticLayer max_cache_len=2048`, `none` without a cache."""
        if not self.cache_classes:
            return "none"
        layers = sorted({classes[0] for classes in self.layer_classes})
        text = f"{self.cache_classes[0]}/{'+'.join(layers) or '-'}"
        if self.max_cache_len is not None:
            text += f" max_cache_len={self.max_cache_len}"
        if self.nbits is not None:
            text += f" nbits={self.nbits}"
        for setting, default in QUANTIZED_SETTINGS.items():
            value = getattr(self, setting)
            if value is not None and value != default:
                text += f" {setting}={value}"
        if self.offloading:
            text += " offloading=true"
        return text


def describe_cache(cache: Any) -> CacheIdentity:
    if cache is None:
        return CacheIdentity((), ())
    layers = list(getattr(cache, "layers", []) or [])
    # A sliding-window layer reserves only its window: the request's length is what full layers hold.
    full = [layer for layer in layers if not getattr(layer, "is_sliding", False)]
    lengths = [n for n in (getattr(layer, "max_cache_len", None) for layer in full) if isinstance(n, int)]
    return CacheIdentity(
        cache_classes=_class_names(cache),
        layer_classes=tuple(_class_names(layer) for layer in layers),
        offloading=bool(getattr(cache, "offloading", False)),
        max_cache_len=max(lengths) if lengths else None,
        nbits=_shared(layers, "nbits"),
        **{setting: _shared(layers, setting) for setting in QUANTIZED_SETTINGS},
    )


def _shared(layers: list[Any], attribute: str) -> int | None:
    """The value every layer that has `attribute` holds; None when none has it or they differ."""
    values = {getattr(layer, attribute, None) for layer in layers} - {None}
    return values.pop() if len(values) == 1 else None


def mismatch(strategy: CacheStrategy, got: CacheIdentity, cached_tokens: int) -> str | None:
    """None when `got` is what `strategy` must produce for a call caching `cached_tokens` tokens."""
    expected = expected_tag(strategy, cached_tokens)
    problems = []
    if strategy.cache_class is None:
        if got.cache_classes:
            problems.append("a cache object")
    else:
        if strategy.cache_class not in got.cache_classes:
            problems.append("cache class")
        # A hybrid model's state layers (linear attention, Mamba) are the model's, whatever the strategy:
        # the strategy's layer class is what every attention layer must be.
        attention = [layer for layer in got.layer_classes if STATE_LAYER_BASE not in layer]
        if not attention or any(strategy.layer_class not in layer for layer in attention):
            problems.append("layer class")
        if got.offloading != strategy.offloading:
            problems.append("offloading")
        if strategy.nbits is not None and got.nbits != strategy.nbits:
            problems.append("nbits")
        if strategy.group_wise:  # checked where the layers expose them (Transformers' do)
            problems += [
                setting
                for setting in QUANTIZED_SETTINGS
                if getattr(got, setting) is not None and getattr(got, setting) != getattr(strategy, setting)
            ]
        # None: every layer slides (reserves only its window), so no layer shows the request's length
        length = got.max_cache_len
        if strategy.preallocates and length is not None and length != expected_length(strategy, cached_tokens):
            problems.append("reserved length")
    if not problems:
        return None
    return f"asked for {strategy.name} ({expected}) but generate used {got.tag} (differs in {', '.join(problems)})"


def expected_length(strategy: CacheStrategy, cached_tokens: int) -> int:
    return max(cached_tokens, strategy.reserve_tokens or 0)


def expected_tag(strategy: CacheStrategy, cached_tokens: int) -> str:
    """The tag an exact match would carry (for error messages)."""
    if strategy.cache_class is None:
        return "none"
    return CacheIdentity(
        cache_classes=(strategy.cache_class,),
        layer_classes=((strategy.layer_class or "-",),),
        offloading=strategy.offloading,
        max_cache_len=expected_length(strategy, cached_tokens) if strategy.preallocates else None,
        nbits=strategy.nbits,
        **{setting: getattr(strategy, setting) for setting in QUANTIZED_SETTINGS if strategy.group_wise},
    ).tag


def _class_names(obj: Any) -> tuple[str, ...]:
    return tuple(klass.__name__ for klass in type(obj).__mro__)


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
    if tensor.device.type == "meta" or (tensor.ndim == 0 and not tensor.is_floating_point()):
        return  # 0-d integer tensors are bookkeeping (lengths, counters); a 0-d float is a per-tensor scale (FP8)
    storage = tensor.untyped_storage()
    seen[(tensor.device.type, tensor.device.index or 0, storage.data_ptr())] = storage.nbytes()  # once each
