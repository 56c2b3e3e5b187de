"""What to do when a strategy fails, following the rollback order of the domain brief (seeds/).

Roll back one setting at a time: first the cache implementation (back to dynamic), then separate
cache problems from model/input problems with use_cache=False, and for OOM shrink the request
before reaching for offloading.
"""

from kvsweep.results import CRASHED, ERROR, OOM, SKIPPED, TIMEOUT


def failure_advice(cache: str, compiled: bool, status: str, error: str) -> str:
    """One sentence for a strategy that did not produce numbers."""
    base = cache.split("@", 1)[0]
    if status == OOM:
        if base.startswith("offloaded"):
            return "OOM even offloaded: reduce max_new_tokens, context or batch; then try a quantized cache"
        if base.startswith("quantized"):
            return "OOM even quantized: reduce max_new_tokens, context or batch, or use a larger GPU"
        return "OOM: reduce max_new_tokens, context or batch, then try offloaded"
    if status == SKIPPED:
        return f"not run: {error}" if error else "not run"
    if status == ERROR and (compiled or base in ("static", "offloaded_static")):
        return "failed: drop static/compile, return to dynamic, then check the fixed length and model support"
    if status in (ERROR, TIMEOUT, CRASHED):
        return (
            "failed: confirm dynamic works on these inputs, then try no_cache on the same inputs to separate "
            "the cache from model/input problems (traceback in the cell's MLflow run)"
        )
    return ""


def slow_quantized_advice(cache: str, slower_than_dynamic: bool, dynamic_ok: bool) -> str:
    """The brief: a quantized cache is a memory card, not a speed-up; not the default when memory is ample."""
    if cache.startswith("quantized") and slower_than_dynamic and dynamic_ok:
        return "slower than dynamic and dynamic fits: do not make a quantized cache the default here"
    return ""


def quality_advice(agreement: float, threshold: float) -> str:
    return (
        f"outputs drift (token agreement {agreement:.2f} < {threshold:.2f}): fall back to dynamic, "
        "reduce context and concurrency to get a baseline"
    )
