"""The one registry of KV cache strategies, in the order the report lists them (simplest first).

A cell names its strategy as a string (`dynamic`, `static@4096`, `quantized-hqq-int4`); this module
is the only place that string is parsed. `register` adds a strategy at run time (a test, a plugin):
the driver sends such strategies to each cell's actor with the cell, so both sides know it.
"""

import contextlib
from collections.abc import Iterator

from kvsweep.caches.accounting import (
    dense_bytes,
    hqq_bytes,
    no_bytes,
    quantized_step_bytes,
    quanto_bytes,
    reserved_bytes,
)
from kvsweep.caches.native_build import QUANTO_CPP, QUANTO_CUDA
from kvsweep.caches.strategy import RESERVE_SEPARATOR, CacheStrategy, Requirements

BASELINE = "dynamic"  # the strategy every other one is compared with (speed, memory, output agreement)
OFFLOADED_DEVICE_LAYERS = 2  # the layer in use and the one being prefetched
_CUDA = Requirements(cuda=True)


def _quantized(backend: str, package: str, layer_class: str, nbits: int) -> CacheStrategy:
    return CacheStrategy(
        name=f"quantized-{backend}-int{nbits}",
        family="quantized",
        implementation="quantized",
        stored_bytes=quanto_bytes if backend == "quanto" else hqq_bytes,
        decode_step_bytes=quantized_step_bytes,
        cache_class="QuantizedCache",
        layer_class=layer_class,
        requires=Requirements(
            package=package, extra="quantized", native_builds=(QUANTO_CPP, QUANTO_CUDA) if backend == "quanto" else ()
        ),
        backend=backend,
        nbits=nbits,
    )


BUILT_IN: tuple[CacheStrategy, ...] = (
    CacheStrategy(
        name="dynamic",
        family="dense",
        implementation="dynamic",
        stored_bytes=dense_bytes,
        cache_class="DynamicCache",
        layer_class="DynamicLayer",
    ),
    CacheStrategy(
        name="static",
        family="static",
        implementation="static",
        stored_bytes=reserved_bytes,
        cache_class="StaticCache",
        layer_class="StaticLayer",
        preallocates=True,
    ),
    CacheStrategy(
        name="offloaded",
        family="offloaded",
        implementation="offloaded",
        stored_bytes=dense_bytes,
        cache_class="DynamicCache",
        layer_class="DynamicLayer",
        requires=_CUDA,
        device_layers=OFFLOADED_DEVICE_LAYERS,
    ),
    CacheStrategy(
        name="offloaded_static",
        family="offloaded",
        implementation="offloaded_static",
        stored_bytes=reserved_bytes,
        cache_class="StaticCache",
        layer_class="StaticLayer",
        requires=_CUDA,
        preallocates=True,
        device_layers=OFFLOADED_DEVICE_LAYERS,
    ),
    *(_quantized("quanto", "optimum.quanto", "QuantoQuantizedLayer", nbits) for nbits in (2, 4)),
    *(_quantized("hqq", "hqq", "HQQQuantizedLayer", nbits) for nbits in (2, 4, 8)),
    CacheStrategy(name="no_cache", family="none", implementation=None, stored_bytes=no_bytes),
)

_REGISTRY: dict[str, CacheStrategy] = {s.name: s for s in BUILT_IN}


def register(strategy: CacheStrategy) -> CacheStrategy:
    """Add a strategy (idempotent for an equal one); a different strategy under a taken name is an error."""
    if RESERVE_SEPARATOR in strategy.name:
        raise ValueError(f"strategy name {strategy.name!r} must not contain {RESERVE_SEPARATOR!r}")
    known = _REGISTRY.setdefault(strategy.name, strategy)
    if known != strategy:
        raise ValueError(f"a different strategy is already registered as {strategy.name!r}")
    return strategy


@contextlib.contextmanager
def registered(strategy: CacheStrategy) -> Iterator[CacheStrategy]:
    """`register` for the length of a block (a test, an experiment), then forget it again."""
    added = strategy.name not in _REGISTRY
    register(strategy)
    try:
        yield strategy
    finally:
        if added:
            del _REGISTRY[strategy.name]


def registered_beyond_built_ins() -> list[CacheStrategy]:
    """What the driver must send each actor: a fresh process knows only the built-ins."""
    return [s for s in _REGISTRY.values() if s not in BUILT_IN]


def cache_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def reservable_names() -> tuple[str, ...]:
    return tuple(n for n, s in _REGISTRY.items() if s.preallocates)


def allowed_cache_names() -> str:
    reserved = ", ".join(f"{n}{RESERVE_SEPARATOR}N" for n in reservable_names())
    return ", ".join(cache_names()) + f" (and {reserved} to reserve N tokens)"


def parse_cache_name(name: str) -> tuple[str, int | None]:
    """`static@4096` -> ("static", 4096); `dynamic` -> ("dynamic", None). The only parser of `@N`."""
    base, sep, reserve = name.partition(RESERVE_SEPARATOR)
    if not sep:
        return base, None
    if not reserve.isdigit() or int(reserve) <= 0:
        raise KeyError(f"unknown cache {name!r}: {RESERVE_SEPARATOR}N needs a positive whole number of tokens")
    return base, int(reserve)


def get_strategy(name: str) -> CacheStrategy:
    """Look a cache name up; raises KeyError with the allowed names when it is unknown."""
    strategy = find_strategy(name)
    if strategy is None:
        raise KeyError(f"unknown cache {name!r}; allowed: {allowed_cache_names()}")
    return strategy


def find_strategy(name: str) -> CacheStrategy | None:
    """The strategy, or None when the name is unknown here (e.g. a past run of a strategy registered then)."""
    try:
        base, reserve = parse_cache_name(name)
    except KeyError:
        return None
    strategy = _REGISTRY.get(base)
    if strategy is None or (reserve is not None and not strategy.preallocates):
        return None
    return strategy if reserve is None else strategy.reserving(reserve)


def cache_rank(name: str) -> tuple[int, int]:
    """Registry order, simplest first (`dynamic` before `static` ...), then the reserved length of `@N`."""
    names = cache_names()
    try:
        base, reserve = parse_cache_name(name)
    except KeyError:
        base, reserve = name, None
    return (names.index(base) if base in names else len(names), reserve or 0)
