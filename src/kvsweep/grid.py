"""Grid expansion: the cartesian product of the config's axes, as plain `Cell` values."""

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass
from typing import Any

from kvsweep.caches import get_strategy
from kvsweep.model_names import short_name

CELL_FIELDS = ("model", "dtype", "context_length", "batch_size", "max_new_tokens", "cache", "compile")


@dataclass(frozen=True)
class Cell:
    """One grid point: everything that decides what is measured."""

    model: str
    dtype: str
    context_length: int
    batch_size: int
    max_new_tokens: int
    cache: str
    compile: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        return cell_label(self)

    @property
    def cached_tokens(self) -> int:
        return cached_tokens(self.context_length, self.max_new_tokens)


def cached_tokens(context_length: int, max_new_tokens: int) -> int:
    """Tokens whose K/V the cache holds after generation (the last token's is never computed)."""
    return context_length + max_new_tokens - 1


# The protocol's fields added after cell ids were first published, at the values that meant "off" before
# they existed: no time floor, no cap, no contention guard, no precision target. A cell id leaves a field
# out at this value, so the ids of cells measured before it existed stay valid; `MeasureProtocol.exact`
# turns them all off. Not defaults: a sweep's protocol is built from its `measure` config, every field given.
RULES_OFF: dict[str, Any] = {
    "min_duration_s": 0.0,
    "max_repeats": 0,
    "max_host_contention": 1.0,
    "max_discarded": 0,
    "target_rel_ci": 0.0,
    "max_duration_s": 0.0,
}


@dataclass(frozen=True)
class MeasureProtocol:
    """How every cell of a sweep is measured (its `measure` config, on one device); part of each cell's id."""

    warmup: int
    repeats: int  # at least this many measured runs...
    seed: int
    device: str
    threads: int
    min_duration_s: float  # ...and at least this much measured time (fast cells get more runs)
    max_repeats: int  # at most this many measured runs when min_duration_s asks for more; 0 = repeats
    max_host_contention: float  # share of the cell's CPUs others may take in a kept call; 1 = off
    max_discarded: int  # contended calls re-run per cell
    target_rel_ci: float  # keep measuring until each 95% interval is within +-this of its median; 0 = off
    max_duration_s: float  # time cap on the measured phase; 0 = none

    @classmethod
    def exact(cls, warmup: int, repeats: int, seed: int, device: str, threads: int) -> "MeasureProtocol":
        """Exactly `repeats` measured runs after `warmup`, every later rule off (`RULES_OFF`)."""
        return cls(warmup=warmup, repeats=repeats, seed=seed, device=device, threads=threads, **RULES_OFF)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def repeat_cap(self) -> int:
        return max(self.repeats, self.max_repeats)

    def identity(self) -> dict[str, Any]:
        """What a cell id hashes: every field, less those at their `RULES_OFF` value (older ids stay valid)."""
        return {k: v for k, v in asdict(self).items() if k not in RULES_OFF or v != RULES_OFF[k]}


def strategy_label(cell: Cell) -> str:
    """`static+compile`: the strategy as a cell runs it, the name a report row and a run name start with."""
    return cell.cache + ("+compile" if cell.compile else "")


def cell_label(cell: Cell, model_name: str = "") -> str:
    """`static+compile ctx64 bs1 float32 local-llama`: the cell's MLflow run name, progress line and plan line.

    The model by its display name (model_names.py); the run name is part of the MLflow contract.
    """
    model = model_name or short_name(cell.model)
    return f"{strategy_label(cell)} ctx{cell.context_length} bs{cell.batch_size} {cell.dtype} {model}"


def cell_id(cell: Cell, protocol: MeasureProtocol) -> str:
    """Stable hash of the cell's settings and measurement protocol (resume key, MLflow tag)."""
    payload = json.dumps({"cell": cell.to_dict(), "protocol": protocol.identity()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def expand_grid(grid: dict[str, list[Any]]) -> list[Cell]:
    """All combinations, in the config's order: models, dtypes, batch sizes, context lengths, new
    tokens, caches, compile, the first varying slowest and each axis as the config lists it (the plan
    reads like the sweep file). The sweep runs them in another order, smallest first
    (`driver/oom_inference.size_order`), so an OOM at a small size can spare the larger cells.

    compile=true only means something for strategies that preallocate (static ones); other
    strategies get no compiled twin instead of a pointless skipped cell.
    """
    axes = [
        grid["models"],
        grid["dtypes"],
        grid["batch_sizes"],
        grid["context_lengths"],
        grid["max_new_tokens"],
        grid["caches"],
        grid["compile"],
    ]
    cells = [
        Cell(model, dtype, ctx, batch, new, cache, bool(compiled))
        for model, dtype, batch, ctx, new, cache, compiled in itertools.product(*axes)
        if not compiled or get_strategy(cache).compilable
    ]
    return _dedupe(cells)


def _dedupe(cells: list[Cell]) -> list[Cell]:
    seen: dict[Cell, None] = {}
    for cell in cells:
        seen.setdefault(cell, None)
    return list(seen)
