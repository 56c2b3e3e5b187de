"""What a KV cache strategy is: every fact the planner, the cell, the report and the advice read.

A strategy names how `generate` is asked for it, what it needs to run, how it holds its bytes, what
cache object it must produce, and which rollback advice applies to it. Nothing else in kvsweep
re-derives any of that from the strategy's name.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from kvsweep.caches.native_build import NativeBuild

Family = Literal["dense", "static", "offloaded", "quantized", "paged", "none"]
RESERVE_SEPARATOR = "@"

# Transformers' `QuantizedLayer` defaults: a name without `@` settings asks for exactly these.
DEFAULT_RESIDUAL_LENGTH = 128  # tokens kept unquantized before they are flushed into the packed store
DEFAULT_GROUP_SIZE = 64  # elements sharing one scale and one zero point
DEFAULT_AXIS = 0  # the axis each group runs along, for keys and for values


class KvDims(Protocol):
    """The model shape the byte accounting needs (`models.resolve.KvShape` is one)."""

    layers: int
    kv_heads: int
    head_dim: int
    # Per layer (both () when every layer is full attention): the tokens a layer keeps (None: all; a
    # number: a sliding window or chunk; 0: no keys or values), and its fixed state's elements per batch row.
    layer_windows: tuple[int | None, ...]
    state_elements: tuple[int, ...]
    # Per layer, its type as Transformers names it (() when every layer is `full_attention`): what the caches
    # that refuse some types judge by (`layer_tokens.refused_layers`).
    layer_types: tuple[str, ...]


# (strategy, shape, batch, dtype, prompt tokens, decoded tokens) -> bytes the cache holds
StoredBytes = Callable[["CacheStrategy", KvDims, int, str, int, int], int]
# (strategy, shape, batch, dtype, prompt tokens, tokens the call makes, decode step 1 ..) -> device bytes
StepBytes = Callable[["CacheStrategy", KvDims, int, str, int, int, int], int]
# (strategy, shape, batch, prompt tokens, tokens the call makes) -> why the cache cannot hold it, or None
ShapeProblem = Callable[["CacheStrategy", KvDims, int, int, int], str | None]


@dataclass(frozen=True)
class Requirements:
    """What a strategy needs before it can run; a cell that lacks it is skipped, saying what to install."""

    cuda: bool = False
    package: str | None = None  # importable module
    extra: str | None = None  # kvsweep's pip extra that brings the package
    native_builds: tuple["NativeBuild", ...] = ()  # extensions the package compiles on first use, per device

    def install_hint(self) -> str:
        return f"pip install 'kvsweep[{self.extra}]'" if self.extra else f"pip install {self.package}"


@dataclass(frozen=True)
class Rollback:
    """The rollback order (`report/advice.py`), as it applies to one family of strategies."""

    on_oom: str
    on_error: str = (
        "failed: confirm dynamic works on these inputs, then try no_cache on the same inputs to separate "
        "the cache from model/input problems (traceback in the cell's MLflow run)"
    )
    when_slower_than_dynamic: str = ""  # said when it is slower than a dynamic cache that also fits


_OOM_SHRINK = "OOM: reduce max_new_tokens, context or batch, then try offloaded"
STATIC_ERROR = "failed: drop static/compile, return to dynamic, then check the fixed length and model support"

ROLLBACK: dict[Family, Rollback] = {
    "dense": Rollback(_OOM_SHRINK),
    "static": Rollback(_OOM_SHRINK, on_error=STATIC_ERROR),
    "offloaded": Rollback("OOM even offloaded: reduce max_new_tokens, context or batch; then try a quantized cache"),
    "quantized": Rollback(
        "OOM even quantized: reduce max_new_tokens, context or batch, or use a larger GPU",
        when_slower_than_dynamic="slower than dynamic and dynamic fits: do not make a quantized cache the default here",
    ),
    "paged": Rollback(
        "OOM: a smaller pool (paged@N), context or batch; the pool is reserved whole before the first request",
        on_error="failed: return to dynamic, then check the model's attention runs under continuous batching "
        "(sdpa, eager or flash)",
    ),
    "none": Rollback(_OOM_SHRINK),
}


@dataclass(frozen=True, kw_only=True)
class CacheStrategy:
    name: str
    family: Family
    implementation: str | None  # `cache_implementation` for generate; None means use_cache=False
    stored_bytes: StoredBytes  # the bytes it holds (caches/accounting.py), checked against real caches
    # The device bytes a decode step moves for it (caches/accounting.py); None: attention reads the cache
    # as it is after the step's update (`accounting.attended_bytes`), as a dense or static cache does.
    decode_step_bytes: StepBytes | None = None
    # What `generate` must hand back (checked on every ok cell: a silent fallback in transformers must
    # never be logged under this strategy's name). None: no cache object at all.
    cache_class: str | None = None
    layer_class: str | None = None
    requires: Requirements = Requirements()
    backend: str | None = None  # quantized backend name for `cache_config`
    nbits: int | None = None  # a group-wise backend's integer bits (None for FP8: the layer class says it)
    # The quantized layer's settings (`cache_config`), named as Transformers names them; a name's
    # `@r256,g32,ak1,av1` sets them (registry.py). Ignored by strategies without a backend.
    residual_length: int = DEFAULT_RESIDUAL_LENGTH
    q_group_size: int = DEFAULT_GROUP_SIZE
    axis_key: int = DEFAULT_AXIS
    axis_value: int = DEFAULT_AXIS
    # Why a request's tensors cannot be quantized with these settings (caches/accounting.py), before
    # anything runs; None: any request fits.
    shape_problem: ShapeProblem | None = None
    preallocates: bool = False  # a static layout: allocated whole before the prefill (`allocated_steps`)
    reserve_tokens: int | None = None  # static@N: tokens reserved whatever the request needs
    device_layers: int | None = None  # layers kept on the device at a time (offloading); None: all

    @property
    def offloading(self) -> bool:
        return self.device_layers is not None

    @property
    def compilable(self) -> bool:
        """Only fixed-shape caches compile to one graph; an offloaded static cache moves layers between
        streams and to the host inside the step, which no run has shown to compile (`fullgraph=True`); a paged
        pool is served by continuous batching, which compiles (or not) by its own config."""
        return self.preallocates and self.family not in ("offloaded", "paged")

    @property
    def takes_logits_processors(self) -> bool:
        """Continuous batching samples inside its own loop: no logits processor of the caller's sees its steps,
        so a paged cell's teacher-forced KL cannot be measured (its tokens and task answers can)."""
        return self.family != "paged"

    @property
    def group_wise(self) -> bool:
        """A quantized backend that takes the group-wise settings (quanto, HQQ); FP8's one per-tensor scale
        takes none of them, and Transformers refuses them if passed."""
        return self.backend is not None and self.nbits is not None

    @property
    def base_name(self) -> str:
        return self.name.split(RESERVE_SEPARATOR, 1)[0]

    @property
    def rollback(self) -> Rollback:
        """The family's advice; any preallocating layout fails like a static one (fixed length, compile)."""
        own = ROLLBACK[self.family]
        return replace(own, on_error=STATIC_ERROR) if self.compilable or self.family == "offloaded" else own

    def reserving(self, tokens: int) -> "CacheStrategy":
        """This strategy as `name@tokens`: a static layout reserving `tokens` whatever the request needs."""
        return replace(self, name=f"{self.name}{RESERVE_SEPARATOR}{tokens}", reserve_tokens=tokens)

    def request_problem(self, shape: KvDims, batch: int, prompt: int, new: int) -> str | None:
        """Why this strategy cannot cache a request of `prompt` tokens making `new` (None: it can)."""
        return None if self.shape_problem is None else self.shape_problem(self, shape, batch, prompt, new)

    def held_bytes(self, shape: KvDims, batch: int, dtype: str, prompt: int, decoded: int) -> int:
        """Bytes the cache holds after the prompt and `decoded` decode steps (offloaded: host plus device)."""
        return self.stored_bytes(self, shape, batch, dtype, prompt, decoded)

    def allocated_steps(self, new: int, decoded: int) -> int:
        """The decode steps the cache's tensors span after `decoded` of a call that makes `new` tokens: a static
        layout (`preallocates`) is allocated for the whole call before the prefill, so it spans all `new - 1` from
        the start; any other layout, the steps decoded so far."""
        return new - 1 if self.preallocates else decoded

    def static_length(self, tokens: int) -> int:
        """The length a static layout allocates for `tokens` cached tokens: its reserved length (`static@N`), or
        the request's when that is longer or nothing is reserved."""
        return max(tokens, self.reserve_tokens or 0)

    def generation_options(self) -> dict[str, Any]:
        """Fresh `GenerationConfig` fields for one call (generate mutates `cache_config` in place)."""
        if self.implementation is None:
            return {"use_cache": False}
        kwargs: dict[str, Any] = {"cache_implementation": self.implementation}
        if self.backend is not None and not self.group_wise:
            kwargs["cache_config"] = {"backend": self.backend}
        elif self.backend is not None:
            kwargs["cache_config"] = {
                "backend": self.backend,
                "nbits": self.nbits,
                "residual_length": self.residual_length,
                "q_group_size": self.q_group_size,
                "axis_key": self.axis_key,
                "axis_value": self.axis_value,
            }
        if self.reserve_tokens is not None:
            kwargs["max_cache_len"] = self.reserve_tokens
        return kwargs
