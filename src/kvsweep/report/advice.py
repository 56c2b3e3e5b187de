"""What to do when a strategy fails: roll back one setting at a time, in a fixed order.

First the cache implementation (back to dynamic), then separate cache problems from model/input
problems with use_cache=False, and for OOM shrink the request before reaching for offloading.
Which step applies to which strategy is the registry's fact (`CacheStrategy.rollback`); a cache
unknown here (a past run's) gets the dense family's advice.
"""

from kvsweep.caches import find_strategy
from kvsweep.caches.strategy import ROLLBACK, STATIC_ERROR, Rollback
from kvsweep.results import CRASHED, ERROR, OOM, SKIPPED, TIMEOUT


def _rollback(cache: str) -> Rollback:
    strategy = find_strategy(cache)
    return strategy.rollback if strategy is not None else ROLLBACK["dense"]


def failure_advice(cache: str, compiled: bool, status: str, error: str) -> str:
    """One sentence for a strategy that did not produce numbers."""
    rollback = _rollback(cache)
    if status == OOM:
        return rollback.on_oom
    if status == SKIPPED:
        return f"not run: {error}" if error else "not run"
    if status == ERROR:
        return STATIC_ERROR if compiled else rollback.on_error
    if status in (TIMEOUT, CRASHED):
        return ROLLBACK["dense"].on_error
    return ""


def slow_quantized_advice(cache: str, slower_than_dynamic: bool, dynamic_ok: bool) -> str:
    """A quantized cache saves memory, not time: not the default where dynamic fits and is faster."""
    return _rollback(cache).when_slower_than_dynamic if slower_than_dynamic and dynamic_ok else ""
