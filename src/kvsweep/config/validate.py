"""Value checks the schema's types cannot express; each failure is one line naming the key.

Every numeric key's range is its `Bound` in the schema, read from there; so are the choice lists
(`RANK_BY`, `DEVICES`). What is left here: names checked against those lists and the registries, and
the checks that compare one key with another.
"""

import dataclasses
from pathlib import Path
from typing import Any

from kvsweep.caches import get_strategy
from kvsweep.config.schema import DEVICES, OBJECTIVES, RANK_BY, RANK_BY_PERCENTILES, Bound, KvSweepConfig
from kvsweep.errors import ConfigError
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, cached_tokens
from kvsweep.models.weight_schemes import weight_scheme
from kvsweep.units import DTYPE_BYTES as DTYPES
from kvsweep.workload.request_mix import WorkloadError
from kvsweep.workload.workload_spec import FILE, LENGTHS, SERVING_MODES, TRACE, workload_from_config


def validate(cfg: dict[str, Any], given: list[str] | None = None) -> None:
    """`given`: the keys the command line set (a sweep file's own axes are its business)."""
    grid = cfg["grid"]
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"grid.{key} is empty; give at least one value")
    for i, name in enumerate(grid["caches"]):
        try:
            get_strategy(name)
        except KeyError as err:  # the registry's one-line message names the bad part and what is allowed
            raise ConfigError(f"grid.caches[{i}]: {err.args[0]}") from None
    for i, name in enumerate(grid["weights"]):
        try:
            weight_scheme(str(name))
        except ValueError as err:  # one line naming the bad name and the schemes there are
            raise ConfigError(f"grid.weights[{i}]: {err}") from None
    for i, dtype in enumerate(grid["dtypes"]):
        if dtype not in DTYPES:
            raise ConfigError(f"grid.dtypes[{i}]: unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    for i, model in enumerate(grid["models"]):
        if not str(model).strip():
            raise ConfigError(f"grid.models[{i}] is empty; give a preset name, a local path or a Hub id")
    check_bounds(cfg)
    _validate_reserves(grid)
    if cfg["device"] not in DEVICES:
        raise ConfigError(f"device: unknown device {cfg['device']!r}; allowed: {', '.join(DEVICES)}")
    _validate_measure(cfg["measure"])
    _validate_report(cfg["report"])
    _validate_workload(cfg, given or [])
    _validate_search(cfg["search"], cfg["slo"], bool(cfg["workload"]["source"]))
    if not cfg["mlflow"]["experiment"].strip():
        raise ConfigError("mlflow.experiment is empty; give an experiment name")


def _validate_report(report: dict[str, Any]) -> None:
    """The selection's names: what it ranks by, what it optimises, the latencies it waives."""
    if report["rank_by"] not in (*RANK_BY, *RANK_BY_PERCENTILES):
        allowed = ", ".join(RANK_BY) + " or a workload percentile such as tpot_ms_p99"
        raise ConfigError(f"report.rank_by: unknown metric {report['rank_by']!r}; allowed: {allowed}")
    if report["objective"] not in OBJECTIVES:
        raise ConfigError(f"report.objective: unknown {report['objective']!r}; allowed: {', '.join(OBJECTIVES)}")
    for i, name in enumerate(report["waive_slowdown"]):
        if name not in RANK_BY:
            raise ConfigError(f"report.waive_slowdown[{i}]: unknown latency {name!r}; allowed: {', '.join(RANK_BY)}")


def check_bounds(values: dict[str, Any], node: type = KvSweepConfig, prefix: str = "") -> None:
    """Every field of the schema that carries a `Bound`: its value, or each item of a list or map."""
    for f in dataclasses.fields(node):  # type: ignore[arg-type]
        key, value = f"{prefix}{f.name}", values[f.name]
        if dataclasses.is_dataclass(f.default_factory):
            check_bounds(value, f.default_factory, f"{key}.")  # type: ignore[arg-type]
            continue
        bound: Bound | None = f.metadata.get("bound")
        if bound is None:
            continue
        for where, item in _items(key, value):
            if not bound.allows(item):
                raise ConfigError(f"{where} must be {bound.describe()}, got {item}")


def _items(key: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, list):
        return [(f"{key}[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return [(f"{key}.{name}", item) for name, item in value.items()]
    return [(key, value)]


def _validate_reserves(grid: dict[str, Any]) -> None:
    """`static@N` must hold the longest request: Transformers would silently size a smaller one to the
    request (its `max_cache_len` is a floor), so the cell would be a plain static one under another name."""
    context, new = max(grid["context_lengths"]), max(grid["max_new_tokens"])
    needed = cached_tokens(context, new)
    for i, name in enumerate(grid["caches"]):
        strategy = get_strategy(name)
        if strategy.reserve_tokens is not None and strategy.reserve_tokens < needed:
            raise ConfigError(
                f"grid.caches[{i}]: {name} reserves {strategy.reserve_tokens} tokens but the longest request "
                f"(context {context} + {new} new tokens) needs {needed}; "
                f"use {strategy.base_name}@{needed} or more, or shorter requests"
            )


def _validate_measure(m: dict[str, Any]) -> None:
    if 0 < m["max_repeats"] < m["repeats"]:
        raise ConfigError(
            f"measure.max_repeats ({m['max_repeats']}) is below measure.repeats ({m['repeats']}); "
            "raise it or use 0 (= repeats)"
        )
    if 0 < m["max_duration_s"] < m["min_duration_s"]:
        raise ConfigError(
            f"measure.max_duration_s ({m['max_duration_s']}) is below measure.min_duration_s "
            f"({m['min_duration_s']}); raise it or use 0 (no cap)"
        )


def _validate_search(search: dict[str, Any], slo: dict[str, Any], workload: bool) -> None:
    """An SLO decides where a search stops and which of a workload's requests count as goodput: set without
    either it would change nothing, silently."""
    if search["batch"] or search["contexts"] or workload:
        return
    for key, value in slo.items():
        if value > 0:
            raise ConfigError(
                f"slo.{key} is set but no search is on and no workload; it decides where search.batch=true or "
                "search.contexts=true stop, and a workload's goodput"
            )


def _validate_workload(cfg: dict[str, Any], given: list[str]) -> None:
    """A workload replaces the context and new-token axes, so setting those on the command line too would be
    ignored: refused. What needs a file (a trace, a prompts file) is read by the command (`check_workload`)."""
    workload = cfg["workload"]
    if not workload["source"]:
        return
    for key in ("context_lengths", "max_new_tokens"):
        if f"grid.{key}" in given:
            raise ConfigError(
                f"grid.{key} is set but workload.source={workload['source']} replaces it with the mix's lengths; "
                f"drop one of them"
            )
    if cfg["search"]["batch"] or cfg["search"]["contexts"]:
        raise ConfigError("a capacity search (search.*) and a workload cannot run in one sweep; drop one of them")
    if workload["source"] not in (TRACE, FILE):
        try:
            workload_from_config(_Namespace(workload), seed=0)
        except WorkloadError as err:
            raise ConfigError(str(err)) from None
    else:
        for mode in workload["serving"]:
            if mode not in SERVING_MODES:
                raise ConfigError(f"workload.serving: unknown mode {mode!r}; allowed: {', '.join(SERVING_MODES)}")
    for key, why in IGNORED_BY_SOURCE.get(workload["source"], {}).items():
        if workload[key]:
            raise ConfigError(
                f"workload.{key} is set but workload.source={workload['source']} {why}; drop workload.{key}"
            )


# Keys a workload source would silently ignore: set, they are refused (what the user typed must count).
IGNORED_BY_SOURCE = {
    TRACE: {
        "input_lengths": "takes each request's prompt length from the trace",
        "output_lengths": "takes each request's output length from the trace",
    },
    FILE: {"input_lengths": "takes each prompt's length from the prompts file"},
    LENGTHS: {"path": "draws its requests from input_lengths/output_lengths, reading no file"},
}


class _Namespace:
    """A config section's dict read as attributes, as `workload_from_config` reads the typed config."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def check_workload(cfg: Any) -> None:
    """The workload as the sweep will draw it (a trace or prompts file read, every line checked; a prompts file
    encoded by each model's tokenizer; a trace's request or a file's prompt beyond a model's positions): one line
    naming what is wrong, before Ray starts. The command runs it, as it reads files (`--cfg job` reads none)."""
    from kvsweep.plan.sweep_plan import model_facts, sweep_workload  # tokenizers, model configs: only when run
    from kvsweep.plan.workload_cells import model_mix

    try:
        workload = sweep_workload(cfg)
    except WorkloadError as err:
        raise ConfigError(str(err)) from None
    if workload is None or workload.source not in (TRACE, FILE):
        return
    facts, _ = model_facts(list(dict.fromkeys(cfg.grid.models)), cfg.trust_remote_code, cfg.grid.weights)
    for model, fact in facts.items():  # a model that cannot be read is the plan's to report
        model_mix(workload, model, fact.shape.max_positions if fact.shape else None)


def check_gguf_models(models: list[str], weights: list[str]) -> None:
    """A `.gguf` model that cannot be swept (no `gguf` package, no such file, not a GGUF file, an architecture
    Transformers cannot load from GGUF), or one `grid.weights` would quantize again: one line naming it, before
    Ray starts. It reads the files, so the command runs it rather than composing (`--cfg job` reads none)."""
    from kvsweep.models.gguf_header import read_gguf_header
    from kvsweep.models.gguf_source import gguf_problem, gguf_weights_problem, is_gguf

    asked = [str(w) for w in weights if w != NO_WEIGHT_QUANTIZATION]
    for i, model in enumerate(models):
        if not is_gguf(str(model)):
            continue
        if problem := gguf_problem(str(model)):
            raise ConfigError(f"grid.models[{i}] {model!r}: {problem}")
        if asked:
            local = Path(str(model)).expanduser()
            gguf_type = read_gguf_header(local).quantization if local.is_file() else None
            raise ConfigError(gguf_weights_problem(str(model), gguf_type, asked[0]))
