"""What the selection decides by: the `report` settings and the SLOs, read from the config or a parent run."""

from dataclasses import dataclass
from typing import Any

from kvsweep.config.schema import ReportConfig

_DEFAULTS = ReportConfig()  # the schema's `report` section: every default below is read from it


def _names(value: Any) -> tuple[str, ...]:
    """A list setting as the config gives it, or as MLflow keeps it (the string "['ttft_ms']")."""
    if isinstance(value, str):
        return tuple(part.strip(" '\"") for part in value.strip("[]").split(",") if part.strip(" '\""))
    return tuple(str(v) for v in value or ())


@dataclass(frozen=True)
class Settings:
    """The selection's settings: the schema's `report` keys that decide picks (`gpu_hour_cost` is capacity's),
    and the SLOs (`slo.*`) a pick must meet."""

    rank_by: str = _DEFAULTS.rank_by  # `RANK_BY`, or a workload percentile of one (`tpot_ms_p99`)
    max_slowdown: float = _DEFAULTS.max_slowdown
    min_token_agreement: float = _DEFAULTS.min_token_agreement  # below it: flagged, never deciding alone
    max_accuracy_drop: float = _DEFAULTS.max_accuracy_drop  # accuracy below dynamic's by more, significant: refused
    max_kl: float = _DEFAULTS.max_kl  # mean teacher-forced KL from dynamic (nats) above it: refused if no task judges
    objective: str = _DEFAULTS.objective  # what the pick optimises within the constraints: `OBJECTIVES`
    waive_slowdown: tuple[str, ...] = ()  # latencies a pick may be slower on than max_slowdown allows
    slo_ttft_ms: float = 0.0  # `slo.*`: 0 is none
    slo_tpot_ms: float = 0.0

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> "Settings":
        """From the config's `report` section (with `slo_ttft_ms`/`slo_tpot_ms`) or the parent run's `report.*`
        and `slo.*` params (strings); missing: defaults."""
        defaults = cls()
        return cls(
            rank_by=str(values.get("rank_by", defaults.rank_by)),
            max_slowdown=float(values.get("max_slowdown", defaults.max_slowdown)),
            min_token_agreement=float(values.get("min_token_agreement", defaults.min_token_agreement)),
            max_accuracy_drop=float(values.get("max_accuracy_drop", defaults.max_accuracy_drop)),
            max_kl=float(values.get("max_kl", defaults.max_kl)),
            objective=str(values.get("objective", defaults.objective)),
            waive_slowdown=_names(values.get("waive_slowdown", defaults.waive_slowdown)),
            slo_ttft_ms=float(values.get("slo_ttft_ms", defaults.slo_ttft_ms)),
            slo_tpot_ms=float(values.get("slo_tpot_ms", defaults.slo_tpot_ms)),
        )
