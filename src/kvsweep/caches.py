"""The one registry of KV cache strategies.

A name maps to how `generate` is asked for the strategy, what the strategy needs to run, and how
its memory is stored, so the planner, the runner and the estimates read the same facts.
"""

from dataclasses import dataclass
from typing import Any

RESERVE_SEPARATOR = "@"


@dataclass(frozen=True)
class CacheStrategy:
    name: str
    implementation: str | None  # `cache_implementation` for generate; None means use_cache=False
    needs_cuda: bool = False
    needs_package: str | None = None  # importable module the strategy needs
    backend: str | None = None  # quantized backend name for `cache_config`
    nbits: int | None = None
    preallocates: bool = False  # static layout: the cache is allocated at its full length up front
    reserve_tokens: int | None = None  # static@N: tokens reserved whatever the request needs
    # What `generate` must hand back for this strategy (checked on every ok cell: a silent fallback
    # in transformers must never be logged under this strategy's name). None: no cache object at all.
    cache_class: str | None = None
    layer_class: str | None = None
    offloading: bool = False

    @property
    def compilable(self) -> bool:
        return self.preallocates

    @property
    def base_name(self) -> str:
        return self.name.split(RESERVE_SEPARATOR, 1)[0]

    def generation_options(self) -> dict[str, Any]:
        """Fresh `GenerationConfig` fields for one call (generate mutates `cache_config` in place)."""
        if self.implementation is None:
            return {"use_cache": False}
        kwargs: dict[str, Any] = {"cache_implementation": self.implementation}
        if self.backend is not None:
            kwargs["cache_config"] = {"backend": self.backend, "nbits": self.nbits}
        if self.reserve_tokens is not None:
            kwargs["max_cache_len"] = self.reserve_tokens
        return kwargs


def _quantized(backend: str, package: str, layer_class: str, nbits: int) -> CacheStrategy:
    return CacheStrategy(
        f"quantized-{backend}-int{nbits}",
        "quantized",
        needs_package=package,
        backend=backend,
        nbits=nbits,
        cache_class="QuantizedCache",
        layer_class=layer_class,
    )


_BASE: dict[str, CacheStrategy] = {
    s.name: s
    for s in [
        CacheStrategy("dynamic", "dynamic", cache_class="DynamicCache", layer_class="DynamicLayer"),
        CacheStrategy("static", "static", preallocates=True, cache_class="StaticCache", layer_class="StaticLayer"),
        CacheStrategy(
            "offloaded",
            "offloaded",
            needs_cuda=True,
            cache_class="DynamicCache",
            layer_class="DynamicLayer",
            offloading=True,
        ),
        CacheStrategy(
            "offloaded_static",
            "offloaded_static",
            needs_cuda=True,
            preallocates=True,
            cache_class="StaticCache",
            layer_class="StaticLayer",
            offloading=True,
        ),
        *(_quantized("quanto", "optimum.quanto", "QuantoQuantizedLayer", nbits) for nbits in (2, 4)),
        *(_quantized("hqq", "hqq", "HQQQuantizedLayer", nbits) for nbits in (2, 4, 8)),
        CacheStrategy("no_cache", None),
    ]
}

CACHE_NAMES: tuple[str, ...] = tuple(_BASE)
RESERVABLE: tuple[str, ...] = tuple(n for n, s in _BASE.items() if s.preallocates)
# Tokens each quantized layer keeps unquantized before flushing them into the packed store
# (transformers' QuantizedLayer default `residual_length`).
QUANTIZED_RESIDUAL_TOKENS = 128
QUANTIZED_GROUP_SIZE = 64


def allowed_cache_names() -> str:
    reserved = ", ".join(f"{n}{RESERVE_SEPARATOR}N" for n in RESERVABLE)
    return ", ".join(CACHE_NAMES) + f" (and {reserved} to reserve N tokens)"


def get_strategy(name: str) -> CacheStrategy:
    """Look a cache name up; raises KeyError with the allowed names when it is unknown."""
    base, sep, reserve = name.partition(RESERVE_SEPARATOR)
    strategy = _BASE.get(base)
    if strategy is None or (sep and (base not in RESERVABLE or not reserve.isdigit() or int(reserve) <= 0)):
        raise KeyError(f"unknown cache {name!r}; allowed: {allowed_cache_names()}")
    if not sep:
        return strategy
    return CacheStrategy(**{**strategy.__dict__, "name": name, "reserve_tokens": int(reserve)})


def cache_rank(name: str) -> tuple[int, int]:
    """Registry order, simplest first (`dynamic` before `static` ...), then the reserved length of `@N`."""
    base, _, reserve = name.partition("@")
    return (CACHE_NAMES.index(base) if base in CACHE_NAMES else len(CACHE_NAMES), int(reserve or 0))
