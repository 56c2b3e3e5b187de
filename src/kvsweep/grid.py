"""Grid expansion: the cartesian product of the config's axes, as plain `Cell` values."""

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from kvsweep.caches import get_strategy
from kvsweep.config.measure_config import MeasureConfig
from kvsweep.inputs.spec import RANDOM, TASKS, InputSpec
from kvsweep.model_names import short_name
from kvsweep.names import PARAM_KEYS
from kvsweep.workload.workload_spec import WorkloadSpec

CELL_FIELDS = PARAM_KEYS  # a cell's fields, in order: each is logged as an MLflow param of that name
# Logged only on a workload cell; a cell's id leaves them out at their defaults ("", 0), so older ids stay
WORKLOAD_FIELDS = ("workload", "serving", "rate")
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
    # A workload cell (`workload.*`): the request mix's name and how it is served; context_length and max_new_tokens
    # are then the mix's longest prompt and output (what the planner fits). "" for a cell of one fixed shape.
    workload: str = ""
    serving: str = ""
    rate: float = 0.0  # Poisson arrivals a second it is offered (`workload.rate`); 0: closed loop or a trace's times

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_workload(self) -> bool:
        return bool(self.workload)

    @property
    def label(self) -> str:
        return cell_label(self)

    @property
    def cached_tokens(self) -> int:
        return cached_tokens(self.context_length, self.max_new_tokens)


def cached_tokens(context_length: int, max_new_tokens: int) -> int:
    """Tokens whose K/V the cache holds after generation (the last token's is never computed)."""
    return context_length + max_new_tokens - 1


# The version of what a cell id hashes and of how its numbers are counted. Bumped whenever a release changes
# either: every cell is then measured again under a new parent run, never resumed beside an older release's
# cells (driver/sweep_tracking.py says which parent it left, and why).
PROTOCOL_VERSION = 3

# What `MeasureProtocol.exact` turns off: no time floor, no cap, no contention guard, no precision target, no
# time cap and no memory limit.
RULES_OFF: dict[str, Any] = {
    "min_duration_s": 0.0,
    "max_repeats": 0,
    "max_host_contention": 1.0,
    "max_discarded": 0,
    "target_rel_ci": 0.0,
    "max_duration_s": 0.0,
    "device_memory_limit_gb": 0.0,
}


@dataclass(frozen=True)
class MeasureProtocol:
    """How every cell of a sweep is measured: its `measure` config as the user set it, on one device, fed
    `inputs`, over `gpus`. Part of each cell's id, whole."""

    measure: MeasureConfig
    device: str
    inputs: InputSpec  # what text-fed cells are given (depths, template, trials, the prompts file)
    gpus: int  # GPUs each cell's model is placed over (`ray.gpus_per_cell` on CUDA; 1 elsewhere)
    workload: WorkloadSpec | None  # the request mix workload cells replay (`workload.*`); None: none

    @classmethod
    def exact(
        cls, warmup: int, repeats: int, seed: int, device: str, threads: int, inputs: InputSpec | None = None
    ) -> "MeasureProtocol":
        """Exactly `repeats` measured runs after `warmup`, every later rule off (`RULES_OFF`); no task trials
        unless `inputs` says otherwise."""
        inputs = inputs or InputSpec(depths=(0.5,), chat_template=True, quality_trials=0)
        measure = MeasureConfig(
            warmup=warmup,
            repeats=repeats,
            seed=seed,
            threads=threads,
            quality_trials=inputs.quality_trials,
            **RULES_OFF,
        )
        return cls(measure, device, inputs, gpus=1, workload=None)

    def with_measure(self, **changes: Any) -> "MeasureProtocol":
        """This protocol with some `measure` keys changed."""
        return replace(self, measure=replace(self.measure, **changes))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MeasureProtocol":
        workload = data.get("workload")
        return cls(
            **{
                **data,
                "measure": MeasureConfig(**data["measure"]),
                "inputs": InputSpec.from_dict(data["inputs"]),
                "workload": WorkloadSpec.from_dict(workload) if workload else None,
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "workload": self.workload.to_dict() if self.workload else None}

    def identity(self) -> dict[str, Any]:
        """What a cell id hashes of the protocol: all of it (the prompts file by its hash, the mix by its own;
        no workload adds nothing, so a fixed-shape sweep keeps its ids)."""
        identity = {**asdict(self), "inputs": self.inputs.identity()}
        identity.pop("workload")
        return identity | ({"workload": self.workload.identity()} if self.workload else {})


def strategy_label(cell: Cell) -> str:
    """`static+compile`: the strategy as a cell runs it, the name a report row and a run name start with."""
    return cell.cache + ("+compile" if cell.compile else "")


def serving_label(cell: Cell) -> str:
    """`sequential`, or `sequential@2rps` for a cell offered a rate: how a workload cell served its mix."""
    return cell.serving + (f"@{cell.rate:g}rps" if cell.rate > 0 else "")


def cell_label(cell: Cell, model_name: str = "") -> str:
    """`static+compile ctx64 bs1 float32 local-llama`: the cell's MLflow run name, progress line and plan line;
    quantized weights follow the model (`... local-llama quanto-int8`); a workload cell names its mix and serving
    mode instead of a context, and its offered rate when it has one (`dynamic chat sequential@2rps bs1 ...`).

    The model by its display name (model_names.py); the run name is part of the MLflow contract.
    """
    model = model_name or short_name(cell.model)
    weights = "" if cell.weights == NO_WEIGHT_QUANTIZATION else f" {cell.weights}"
    shape = f"{cell.workload} {serving_label(cell)}" if cell.is_workload else f"ctx{cell.context_length}"
    return f"{strategy_label(cell)} {shape} bs{cell.batch_size} {cell.dtype} {model}{weights}"


def cell_id(cell: Cell, protocol: MeasureProtocol) -> str:
    """Stable hash of the protocol's version, the cell and its whole measurement protocol (the resume key and
    the `kvsweep.cell_id` tag): any change to any of them is another cell. An open-loop cell's arrival times
    count as well (its rate's, drawn with the seed). The task suite counts only for a cell that runs it: a cell fed
    random ids, the passkey or a file keeps its id whatever `inputs.tasks` says."""
    fields = {k: v for k, v in cell.to_dict().items() if k not in WORKLOAD_FIELDS or v not in ("", 0.0)}  # older ids
    identity = protocol.identity()
    if cell.inputs != TASKS:
        identity["inputs"] = {k: v for k, v in identity["inputs"].items() if k not in ("tasks", "tasks_version")}
    payload = {"version": PROTOCOL_VERSION, "cell": fields, "protocol": identity}
    if cell.rate > 0 and protocol.workload is not None:
        payload["arrivals"] = protocol.workload.arrivals_sha256(cell.rate)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def run_order(cell: Cell) -> tuple[int, int]:
    """The order a sweep runs its cells in: fewest tokens first (batch × (prompt + new)), then the smaller batch, so
    an OOM at a small size can spare the larger cells of its family; the forecast packs them in the same order."""
    return (cell.batch_size * (cell.context_length + cell.max_new_tokens), cell.batch_size)


def expand_grid(grid: dict[str, list[Any]], inputs_by_model: dict[str, str] | None = None) -> list[Cell]:
    """All combinations, in the config's order (the first varying axis slowest), so the plan reads like the
    sweep file. The sweep runs them smallest first (`run_order`), so an OOM at a small size
    can spare the larger cells. compile=true means something only for strategies that preallocate (static ones);
    others get no compiled twin rather than a pointless skipped cell. `inputs_by_model`: what each model is fed
    (`driver/inputs_choice.py`); a model it does not name gets random ids.
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
