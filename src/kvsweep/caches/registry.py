"""The one registry of KV cache strategies, in the order the report lists them (simplest first).

A cell names its strategy as a string (`dynamic`, `static@4096`, `quantized-hqq-int4@r256,g32`), parsed only here:
after `@`, a static layout's reserved length, or a quantized layer's settings (r residual length, g group size,
ak / av key / value axis). `register` adds one at run time (a test, a plugin); the driver sends such strategies to
each cell's actor with the cell.
"""

import contextlib
import re
from collections.abc import Iterator
from dataclasses import replace

from kvsweep.caches.accounting import (
    fp8_bytes,
    fp8_step_bytes,
    hqq_bytes,
    hqq_problem,
    kept_bytes,
    no_bytes,
    quantized_step_bytes,
    quanto_bytes,
    quanto_problem,
)
from kvsweep.caches.native_build import QUANTO_CPP, QUANTO_CUDA
from kvsweep.caches.paged_pool import paged_bytes, paged_problem, paged_step_bytes
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
        shape_problem=quanto_problem if backend == "quanto" else hqq_problem,
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
        stored_bytes=kept_bytes,
        cache_class="DynamicCache",
        layer_class="DynamicLayer",
    ),
    CacheStrategy(
        name="static",
        family="static",
        implementation="static",
        stored_bytes=kept_bytes,
        cache_class="StaticCache",
        layer_class="StaticLayer",
        preallocates=True,
    ),
    CacheStrategy(
        name="offloaded",
        family="offloaded",
        implementation="offloaded",
        stored_bytes=kept_bytes,
        cache_class="DynamicCache",
        layer_class="DynamicLayer",
        requires=_CUDA,
        device_layers=OFFLOADED_DEVICE_LAYERS,
    ),
    CacheStrategy(
        name="offloaded_static",
        family="offloaded",
        implementation="offloaded_static",
        stored_bytes=kept_bytes,
        cache_class="StaticCache",
        layer_class="StaticLayer",
        requires=_CUDA,
        preallocates=True,
        device_layers=OFFLOADED_DEVICE_LAYERS,
    ),
    CacheStrategy(  # Transformers' continuous batching over a page pool reserved whole (caches/paged_pool.py)
        name="paged",
        family="paged",
        implementation="paged",
        stored_bytes=paged_bytes,
        decode_step_bytes=paged_step_bytes,
        shape_problem=paged_problem,
        cache_class="PagedAttentionCache",
        layer_class="FullAttentionCacheAllocator",
        preallocates=True,
    ),
    CacheStrategy(  # Transformers' own FP8 layer: no extra package, one per-tensor scale, no residual
        name="quantized-fp8",
        family="quantized",
        implementation="quantized",
        stored_bytes=fp8_bytes,
        decode_step_bytes=fp8_step_bytes,
        cache_class="QuantizedCache",
        layer_class="Fp8QuantizedLayer",
        backend="fp8",
    ),
    *(_quantized("quanto", "optimum.quanto", "QuantoQuantizedLayer", nbits) for nbits in (2, 4)),
    *(_quantized("hqq", "hqq", "HQQQuantizedLayer", nbits) for nbits in (1, 2, 3, 4, 8)),
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


# A quantized name's `@` settings: the letters a user writes, and the `CacheStrategy` field each sets.
SETTINGS = {"r": "residual_length", "g": "q_group_size", "ak": "axis_key", "av": "axis_value"}
AXES = {"quanto": (0, -1), "hqq": (0, 1)}  # the axes each backend groups along (Transformers checks the same)
SETTINGS_SYNTAX = "@r<residual length>,g<group size>,ak<key axis>,av<value axis>, any of them in any order"


def allowed_cache_names() -> str:
    reserved = ", ".join(f"{n}{RESERVE_SEPARATOR}N" for n in reservable_names())
    return (
        ", ".join(_bits_grouped(cache_names()))
        + f" (and {reserved} to reserve N tokens; quantized-...{SETTINGS_SYNTAX}, e.g. quantized-hqq-int4@r256,g32)"
    )


def _bits_grouped(names: tuple[str, ...]) -> list[str]:
    """`quantized-hqq-int1`, `-int2` ... as `quantized-hqq-int{1,2,...}`: the list fits an error's one line."""
    shown: list[str] = []
    bits: dict[str, list[str]] = {}
    for name in names:
        prefix, sep, nbits = name.rpartition("-int")
        if sep and nbits.isdigit():
            if prefix not in bits:
                bits[prefix] = []
                shown.append(prefix)
            bits[prefix].append(nbits)
        else:
            shown.append(name)
    return [f"{n}-int{{{','.join(bits[n])}}}" if n in bits else n for n in shown]


def parse_cache_name(name: str) -> tuple[str, str | None]:
    """`static@4096` -> ("static", "4096"); `dynamic` -> ("dynamic", None). What follows `@` means what
    the strategy makes of it (`find_strategy`)."""
    base, sep, rest = name.partition(RESERVE_SEPARATOR)
    return base, rest if sep else None


def get_strategy(name: str) -> CacheStrategy:
    """Look a cache name up; raises KeyError with a one-line message naming the bad part and what is allowed."""
    base, rest = parse_cache_name(name)
    strategy = _REGISTRY.get(base)
    if strategy is None:
        if re.fullmatch(r"(r|g|ak|av)-?\d+", name):  # Hydra and YAML split `[a@r64,g32]` at its comma
            raise KeyError(
                f"unknown cache {name!r}: a comma inside [...] splits the list; quote a name with several "
                "settings, e.g. 'grid.caches=[\"quantized-hqq-int4@r256,g32\"]'"
            )
        raise KeyError(f"unknown cache {name!r}; allowed: {allowed_cache_names()}")
    if rest is None:
        return strategy
    if strategy.preallocates:
        if not rest.isdigit() or int(rest) <= 0:
            raise KeyError(
                f"unknown cache {name!r}: {base}{RESERVE_SEPARATOR}N needs a positive whole number of tokens "
                "(r, g, ak and av settings are for quantized caches)"
            )
        return strategy.reserving(int(rest))
    if strategy.group_wise:
        return replace(strategy, name=name, **_quantized_settings(name, strategy, rest))
    if strategy.backend is not None:
        raise KeyError(f"invalid cache {name!r}: {base} keeps one scale per tensor and takes no r, g, ak or av setting")
    allowed = allowed_cache_names()
    raise KeyError(f"unknown cache {name!r}: {base} takes no {RESERVE_SEPARATOR} part; allowed: {allowed}")


def find_strategy(name: str) -> CacheStrategy | None:
    """The strategy, or None when the name is unknown here (e.g. a past run of a strategy registered then)."""
    try:
        return get_strategy(name)
    except KeyError:
        return None


def _quantized_settings(name: str, strategy: CacheStrategy, text: str) -> dict[str, int]:
    """`r256,g32,ak1` -> the `CacheStrategy` fields it sets, checked against what the backend accepts."""
    axes = AXES.get(strategy.backend or "", (0,))
    allowed_axes = " or ".join(str(a) for a in axes)
    settings: dict[str, int] = {}
    for part in text.split(","):
        letters = part.rstrip("-0123456789")
        number = part[len(letters) :]
        field = SETTINGS.get(letters)
        if field is None or not number.lstrip("-").isdigit():
            raise KeyError(f"invalid cache {name!r}: bad setting {part!r}; allowed: {SETTINGS_SYNTAX}")
        if field in settings:
            raise KeyError(f"invalid cache {name!r}: {letters} is given more than once")
        value = int(number)
        if letters in ("r", "g") and value <= 0:
            raise KeyError(f"invalid cache {name!r}: {part!r}: {letters} needs a positive whole number")
        if letters in ("ak", "av") and value not in axes:
            raise KeyError(f"invalid cache {name!r}: {part!r}: {strategy.backend}'s axes are {allowed_axes}")
        settings[field] = value
    _check_hqq_packing(name, replace(strategy, **settings))
    return settings


def _check_hqq_packing(name: str, strategy: CacheStrategy) -> None:
    """HQQ packs codes down a group's rows: refuses what no request length can fix (`hqq_problem` the rest)."""
    if strategy.backend != "hqq" or strategy.nbits is None:
        return
    nbits, group = strategy.nbits, strategy.q_group_size
    for letters, axis in (("ak", strategy.axis_key), ("av", strategy.axis_value)):
        if nbits == 3 and axis == 1:
            raise KeyError(
                f"invalid cache {name!r}: {letters}1: HQQ 3-bit loses its codes along axis 1 of a 4-D K/V tensor "
                "(its dequantize slices rows by the first two dimensions); use axis 0"
            )
        if nbits in (1, 2, 4) and axis == 0 and group % (8 // nbits):
            raise KeyError(
                f"invalid cache {name!r}: g{group}: HQQ {nbits}-bit along axis 0 packs {8 // nbits} rows of a group "
                f"to a byte; the group size must be a multiple of {8 // nbits}"
            )


def cache_rank(name: str) -> tuple[int, int]:
    """Registry order, simplest first (`dynamic` before `static` ...), then the reserved length of `@N`."""
    names = cache_names()
    base, _ = parse_cache_name(name)
    strategy = find_strategy(name)
    reserve = strategy.reserve_tokens if strategy is not None else None
    return (names.index(base) if base in names else len(names), reserve or 0)
