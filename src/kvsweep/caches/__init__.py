"""KV cache strategies: what each one is (`strategy`), the bytes it holds (`accounting`; per layer,
`layer_tokens`), the registry."""

from kvsweep.caches.registry import (
    BASELINE,
    allowed_cache_names,
    cache_names,
    cache_rank,
    find_strategy,
    get_strategy,
    register,
    registered,
    registered_beyond_built_ins,
)
from kvsweep.caches.strategy import CacheStrategy, Family, Requirements

__all__ = [
    "BASELINE",
    "CacheStrategy",
    "Family",
    "Requirements",
    "allowed_cache_names",
    "cache_names",
    "cache_rank",
    "find_strategy",
    "get_strategy",
    "register",
    "registered",
    "registered_beyond_built_ins",
]
