"""Test seams a sweep accepts outside the user-facing config: `+testing.faults=[...]`, `+testing.runner=...`,
`+testing.hub=FOLDER` (Hub repos served from a folder, `fake_hub.py`), `+testing.lease={period_s: 3, by_pid: false}`
(the parent run's lease on short times, judged as from another host: `tracking/lease.py`),
`+testing.mlflow_faults={child_runs: 1}` (a call of the sweep's MLflow tracker fails its first N times, as an
MLflow server that drops a request would: `tracking/client.py`).

Not in the schema, `--help` nor the saved config: composition takes the `testing` node off before typing and hands
it here, to be checked (one line per mistake) and become the typed `Seams` each cell's request carries.

`KVSWEEP_TESTING_REPORTED_VERSIONS`, set in one node's environment, makes that node report other software than it
runs (`'{"transformers": "9.9.9"}'`): a cluster simulated on one machine could not have a mismatch for real.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvsweep.errors import ConfigError

# The fault names `+testing.faults` takes: here, not in `faults.py`, so checking a config imports no torch.
FAULTS = ("oom", "error", "hang", "exit", "recompile", "cuda_init", "slow")
PHASES = ("measure", "quality", "start")
START_FAULTS = ("cuda_init",)  # the faults of the `start` phase, and the only ones it takes


def default_phase(fault: str) -> str:
    """When a fault fires if the config does not say (`during`)."""
    return "start" if fault in START_FAULTS else "measure"


@dataclass(frozen=True)
class Fault:
    """A fault chosen for a cell: its kind and, for `slow`, the milliseconds added to each decode step."""

    kind: str
    ms_per_token: float = 0.0


FAULT_KEYS = ("match", "fault", "during", "ms_per_token")
SEAM_KEYS = ("faults", "runner", "sleep_s", "hub", "split_devices", "lease", "mlflow_faults")
LEASE_KEYS = ("beat_s", "period_s", "window_s", "by_pid")  # tracking/lease.py's LeaseTimes
MLFLOW_FAULT_CALLS = ("child_runs",)  # the tracker's calls `+testing.mlflow_faults={NAME: N}` fails N times


@dataclass(frozen=True)
class Seams:
    faults: list[dict[str, Any]] = field(default_factory=list)  # {match: cell fields, fault, during}
    runner: str = ""  # 'module:function' measuring a cell instead of kvsweep's runner (stand_ins.py)
    sleep_s: float = 0.0  # how long the stand-in runner 'measures'
    hub: str = ""  # a folder of repos served in place of the Hugging Face Hub (fake_hub.py)
    split_devices: int = 0  # each cell's model placed over this many CPU devices, as over that many GPUs
    lease: dict[str, Any] = field(default_factory=dict)  # the parent run's lease times (LEASE_KEYS)
    mlflow_faults: dict[str, int] = field(default_factory=dict)  # tracker call -> how many times it fails first
    start_at: float = 0.0  # when the busy stand-in starts spinning (a test's shared window; not from the config)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def seams_from(raw: dict[str, Any] | None) -> Seams:
    """The `testing` node as given on the command line, checked; None (the user's case) means no seams."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - set(SEAM_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown config key 'testing.{unknown[0]}'; allowed keys under testing: {', '.join(SEAM_KEYS)}"
        )
    faults = [_fault(i, fault) for i, fault in enumerate(raw.get("faults") or [])]
    hub = str(raw.get("hub") or "")
    if hub and not Path(hub).is_dir():
        raise ConfigError(f"testing.hub: {hub!r} is not a folder (the repos to serve in place of the Hub)")
    split = raw.get("split_devices") or 0
    if isinstance(split, bool) or not isinstance(split, int) or split < 0:
        raise ConfigError(f"testing.split_devices: {split!r} is not a whole number of devices (0: no split)")
    lease = _lease(dict(raw.get("lease") or {}))
    mlflow_faults = _mlflow_faults(dict(raw.get("mlflow_faults") or {}))
    runner, sleep_s = str(raw.get("runner") or ""), float(raw.get("sleep_s") or 0.0)
    return Seams(faults, runner, sleep_s, hub, split, lease, mlflow_faults)


def _mlflow_faults(given: dict[str, Any]) -> dict[str, int]:
    for call, times in given.items():
        if call not in MLFLOW_FAULT_CALLS:
            raise ConfigError(f"testing.mlflow_faults.{call}: unknown call; allowed: {', '.join(MLFLOW_FAULT_CALLS)}")
        if isinstance(times, bool) or not isinstance(times, int) or times < 0:
            raise ConfigError(f"testing.mlflow_faults.{call}: {times!r} is not a whole number of failures")
    return given


def _lease(given: dict[str, Any]) -> dict[str, Any]:
    for key, value in given.items():
        if key not in LEASE_KEYS:
            raise ConfigError(f"testing.lease.{key}: unknown key; allowed: {', '.join(LEASE_KEYS)}")
        flag = key == "by_pid"
        if isinstance(value, bool) != flag or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"testing.lease.{key}: {value!r} is not {'true or false' if flag else 'seconds'}")
    return given


def _fault(i: int, given: dict[str, Any]) -> dict[str, Any]:
    fault = {"match": {}, "fault": "error", **given}
    fault.setdefault("during", default_phase(str(fault["fault"])))
    unknown = sorted(set(fault) - set(FAULT_KEYS))
    if unknown:
        raise ConfigError(f"testing.faults[{i}].{unknown[0]}: unknown key; allowed: {', '.join(FAULT_KEYS)}")
    if fault["fault"] not in FAULTS:
        raise ConfigError(f"testing.faults[{i}].fault: unknown fault {fault['fault']!r}; allowed: {', '.join(FAULTS)}")
    if fault["during"] not in PHASES:
        raise ConfigError(
            f"testing.faults[{i}].during: unknown phase {fault['during']!r}; allowed: {', '.join(PHASES)}"
        )
    if (fault["fault"] in START_FAULTS) != (fault["during"] == "start"):
        fires = "when the cell starts its device" if fault["fault"] in START_FAULTS else "inside generate"
        allowed = "start" if fault["fault"] in START_FAULTS else "measure or quality"
        raise ConfigError(f"testing.faults[{i}].during: {fault['fault']} fires {fires}; during must be {allowed}")
    if (fault["fault"] == "slow") != ("ms_per_token" in fault):
        raise ConfigError(f"testing.faults[{i}].ms_per_token: the slow fault needs it, and no other fault takes it")
    given = fault.get("ms_per_token", 1)
    if isinstance(given, bool) or not isinstance(given, int | float) or given <= 0:
        raise ConfigError(f"testing.faults[{i}].ms_per_token: {fault['ms_per_token']!r} is not a positive number")
    return fault


REPORTED_VERSIONS_ENV = "KVSWEEP_TESTING_REPORTED_VERSIONS"


def reported_overrides() -> dict[str, str]:
    """The fields this process is told to report instead of its own ({} when the variable is unset)."""
    raw = os.environ.get(REPORTED_VERSIONS_ENV, "").strip()
    if not raw:
        return {}
    try:
        given = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{REPORTED_VERSIONS_ENV} is not JSON ({exc.msg}): {raw[:200]}") from None
    if not isinstance(given, dict):
        raise ValueError(f"{REPORTED_VERSIONS_ENV} must be a JSON object of field -> value, got {raw[:200]}")
    return {str(k): str(v) for k, v in given.items()}
