"""Value checks the schema's types cannot express; each failure is one line naming the key."""

from typing import Any

from kvsweep.caches import allowed_cache_names, get_strategy
from kvsweep.dtypes import DTYPE_BYTES as DTYPES
from kvsweep.errors import ConfigError
from kvsweep.names import Metric

DEVICES = ("auto", "cuda", "cpu")
RANK_BY = (Metric.TPOT_MS, Metric.TTFT_MS, Metric.E2E_MS)


def validate(cfg: dict[str, Any]) -> None:
    grid = cfg["grid"]
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"grid.{key} is empty; give at least one value")
    for i, name in enumerate(grid["caches"]):
        try:
            get_strategy(name)
        except KeyError:
            raise ConfigError(f"grid.caches[{i}]: unknown cache {name!r}; allowed: {allowed_cache_names()}") from None
    for i, dtype in enumerate(grid["dtypes"]):
        if dtype not in DTYPES:
            raise ConfigError(f"grid.dtypes[{i}]: unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    for key in ("context_lengths", "batch_sizes", "max_new_tokens"):
        for i, value in enumerate(grid[key]):
            if value <= 0:
                raise ConfigError(f"grid.{key}[{i}] must be a positive integer, got {value}")
    for i, model in enumerate(grid["models"]):
        if not str(model).strip():
            raise ConfigError(f"grid.models[{i}] is empty; give a preset name, a local path or a Hub id")
    if cfg["device"] not in DEVICES:
        raise ConfigError(f"device: unknown device {cfg['device']!r}; allowed: {', '.join(DEVICES)}")
    _validate_measure(cfg["measure"])
    report = cfg["report"]
    if report["rank_by"] not in RANK_BY:
        raise ConfigError(f"report.rank_by: unknown metric {report['rank_by']!r}; allowed: {', '.join(RANK_BY)}")
    if report["max_slowdown"] < 0:
        raise ConfigError(f"report.max_slowdown must be >= 0 (0.10 = 10%), got {report['max_slowdown']}")
    if not 0 <= report["min_token_agreement"] <= 1:
        raise ConfigError(f"report.min_token_agreement must be between 0 and 1, got {report['min_token_agreement']}")
    ray = cfg["ray"]
    _at_least("ray.gpus_per_cell", ray["gpus_per_cell"], 1)
    _at_least("ray.cpus_per_cell", ray["cpus_per_cell"], 0)  # 0 = auto
    _at_least("ray.max_concurrent", ray["max_concurrent"], 0)
    _at_least("ray.max_retries", ray["max_retries"], 0)
    if ray["cell_timeout_s"] <= 0:
        raise ConfigError(f"ray.cell_timeout_s must be positive, got {ray['cell_timeout_s']}")
    if not cfg["mlflow"]["experiment"].strip():
        raise ConfigError("mlflow.experiment is empty; give an experiment name")


def _at_least(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value}")


def _validate_measure(m: dict[str, Any]) -> None:
    _at_least("measure.repeats", m["repeats"], 1)
    _at_least("measure.warmup", m["warmup"], 0)
    _at_least("measure.threads", m["threads"], 0)
    _at_least("measure.max_discarded", m["max_discarded"], 0)
    for key in ("min_duration_s", "max_duration_s", "wait_for_idle_gpu_s", "target_rel_ci"):
        if m[key] < 0:
            raise ConfigError(f"measure.{key} must be >= 0, got {m[key]}")
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
    if not 0 < m["max_host_contention"] <= 1:
        raise ConfigError(
            f"measure.max_host_contention must be in (0, 1] (a share of the cell's CPUs; 1 = off), "
            f"got {m['max_host_contention']}"
        )
