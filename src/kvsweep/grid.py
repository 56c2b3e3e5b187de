"""Grid expansion: the cartesian product of the config's axes, as plain `Cell` values."""

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass
from typing import Any

from kvsweep.caches import get_strategy
from kvsweep.inputs.spec import RANDOM, InputSpec
from kvsweep.model_names import short_name
from kvsweep.names import PARAM_KEYS

CELL_FIELDS = PARAM_KEYS  # a cell's fields, in order: each is logged as an MLflow param of that name
NO_WEIGHT_QUANTIZATION = "none"  # the model's weights as its checkpoint (or preset) has them


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
    inputs: str = RANDOM  # random | passkey | file:<name>: what the cell is fed (chosen per model)
    weights: str = NO_WEIGHT_QUANTIZATION  # how its weights are quantized when loaded (`grid.weights`)

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
    "device_memory_limit_gb": 0.0,
    "gpus": 1,
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
    device_memory_limit_gb: float  # the cell runs as if its device had this many GB (1e9 bytes); 0 = none
    inputs: InputSpec  # what text-fed cells are given (depths, template, trials, the prompts file)
    gpus: int  # GPUs each cell's model is placed over (`ray.gpus_per_cell` on CUDA; 1 elsewhere)

    @classmethod
    def exact(
        cls, warmup: int, repeats: int, seed: int, device: str, threads: int, inputs: InputSpec | None = None
    ) -> "MeasureProtocol":
        """Exactly `repeats` measured runs after `warmup`, every later rule off (`RULES_OFF`); no task trials
        unless `inputs` says otherwise."""
        inputs = inputs or InputSpec(depths=(0.5,), chat_template=True, quality_trials=0)
        fields = dict(warmup=warmup, repeats=repeats, seed=seed, device=device, threads=threads)
        return cls(**fields, **RULES_OFF, inputs=inputs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MeasureProtocol":
        # a protocol written before cells could span GPUs had one each
        return cls(**{"gpus": 1, **data, "inputs": InputSpec.from_dict(data["inputs"])})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def repeat_cap(self) -> int:
        return max(self.repeats, self.max_repeats)

    def identity(self, cell_inputs: str = RANDOM) -> dict[str, Any]:
        """What a cell id hashes: every field, less those at their `RULES_OFF` value (older ids stay valid).

        The inputs' settings count only for a cell fed text (`cell_inputs` not random): a random-id cell
        measures the same whatever they say, so its id is the one it had before inputs existed."""
        fields = {k: v for k, v in asdict(self).items() if k != "inputs"}
        identity = {k: v for k, v in fields.items() if k not in RULES_OFF or v != RULES_OFF[k]}
        if cell_inputs != RANDOM:
            identity["inputs"] = self.inputs.identity()
        return identity


def strategy_label(cell: Cell) -> str:
    """`static+compile`: the strategy as a cell runs it, the name a report row and a run name start with."""
    return cell.cache + ("+compile" if cell.compile else "")


def cell_label(cell: Cell, model_name: str = "") -> str:
    """`static+compile ctx64 bs1 float32 local-llama`: the cell's MLflow run name, progress line and plan line;
    quantized weights follow the model (`... local-llama quanto-int8`).

    The model by its display name (model_names.py); the run name is part of the MLflow contract.
    """
    model = model_name or short_name(cell.model)
    weights = "" if cell.weights == NO_WEIGHT_QUANTIZATION else f" {cell.weights}"
    return f"{strategy_label(cell)} ctx{cell.context_length} bs{cell.batch_size} {cell.dtype} {model}{weights}"


def cell_id(cell: Cell, protocol: MeasureProtocol) -> str:
    """Stable hash of the cell's settings and measurement protocol (resume key, MLflow tag).

    A cell fed random ids hashes without its `inputs` field, and one whose weights are not quantized without
    its `weights` field, as cells did before those existed."""
    fields = cell.to_dict()
    if cell.inputs == RANDOM:
        del fields["inputs"]
    if cell.weights == NO_WEIGHT_QUANTIZATION:
        del fields["weights"]
    payload = json.dumps({"cell": fields, "protocol": protocol.identity(cell.inputs)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def expand_grid(grid: dict[str, list[Any]], inputs_by_model: dict[str, str] | None = None) -> list[Cell]:
    """All combinations, in the config's order: models, weights, dtypes, batch sizes, context lengths,
    new tokens, caches, compile, the first varying slowest and each axis as the config lists it (the plan
    reads like the sweep file). The sweep runs them in another order, smallest first
    (`driver/oom_inference.size_order`), so an OOM at a small size can spare the larger cells.

    compile=true only means something for strategies that preallocate (static ones); other
    strategies get no compiled twin instead of a pointless skipped cell. `inputs_by_model`: what each
    model is fed (`driver/inputs_choice.py`); a model it does not name gets random ids.
    """
    fed = inputs_by_model or {}
    axes = [
        grid["models"],
        grid.get("weights") or [NO_WEIGHT_QUANTIZATION],
        grid["dtypes"],
        grid["batch_sizes"],
        grid["context_lengths"],
        grid["max_new_tokens"],
        grid["caches"],
        grid["compile"],
    ]
    cells = [
        Cell(model, dtype, ctx, batch, new, cache, bool(compiled), fed.get(model, RANDOM), weights)
        for model, weights, dtype, batch, ctx, new, cache, compiled in itertools.product(*axes)
        if not compiled or get_strategy(cache).compilable
    ]
    return _dedupe(cells)


def _dedupe(cells: list[Cell]) -> list[Cell]:
    seen: dict[Cell, None] = {}
    for cell in cells:
        seen.setdefault(cell, None)
    return list(seen)
