"""Which cache `generate` really used, and whether it is the one the strategy names.

Transformers falls back quietly: a model without default-cache support ignores
`cache_implementation` with only a log warning, and `offloaded` is the dynamic cache class with a
flag. So every ok cell describes the cache object it got back and compares it with what the strategy
registry says the strategy must produce; a mismatch is an error, never a number under a wrong name.
"""

from dataclasses import dataclass
from typing import Any

from kvsweep.caches import CacheStrategy


@dataclass(frozen=True)
class CacheIdentity:
    """The facts of a returned cache object that tell strategies apart."""

    cache_classes: tuple[str, ...]  # the object's class and its bases (subclasses still count)
    layer_classes: tuple[tuple[str, ...], ...]  # per layer: its class and its bases
    offloading: bool = False
    max_cache_len: int | None = None  # the longest layer's reserved length (static layouts)
    nbits: int | None = None

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
    bits = {getattr(layer, "nbits", None) for layer in layers} - {None}
    return CacheIdentity(
        cache_classes=_class_names(cache),
        layer_classes=tuple(_class_names(layer) for layer in layers),
        offloading=bool(getattr(cache, "offloading", False)),
        max_cache_len=max(lengths) if lengths else None,
        nbits=bits.pop() if len(bits) == 1 else None,
    )


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
        if not got.layer_classes or any(strategy.layer_class not in layer for layer in got.layer_classes):
            problems.append("layer class")
        if got.offloading != strategy.offloading:
            problems.append("offloading")
        if strategy.nbits is not None and got.nbits != strategy.nbits:
            problems.append("nbits")
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
    ).tag


def _class_names(obj: Any) -> tuple[str, ...]:
    return tuple(klass.__name__ for klass in type(obj).__mro__)
