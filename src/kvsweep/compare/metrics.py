"""What `compare` compares, per metric: which way is worse, the interval it carries, its verdict words.

Timings carry the 95% interval of their median (decode tokens/s borrows TPOT's, as it is the same
measurement inverted); task accuracies carry their exact binomial interval; memory peaks and the
other quality numbers are single readings; KV cache bytes are exact (a count of stored bytes), so
any change is a change.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvsweep.measure.statistics import metric_interval
from kvsweep.names import Metric

TIMING, MEMORY, EXACT, QUALITY = "timing", "memory", "exact", "quality"

Interval = tuple[float, float]


@dataclass(frozen=True)
class Compared:
    """One metric as `compare` judges it."""

    name: str
    kind: str  # timing | memory | exact | quality
    higher_is_worse: bool
    interval_of: str = ""  # the metric whose 95% interval this one carries ("" = a single reading)
    floor: float = 0.0  # an absolute change at most this large is within noise (shares, nats)
    unit: str = ""

    @property
    def words(self) -> tuple[str, str]:
        """(worse, better) in this metric's terms."""
        return {TIMING: ("slower", "faster"), MEMORY: ("larger", "smaller"), EXACT: ("larger", "smaller")}.get(
            self.kind, ("worse", "better")
        )


COMPARED = (
    Compared(Metric.TTFT_MS, TIMING, True, Metric.TTFT_MS, unit="ms"),
    Compared(Metric.TPOT_MS, TIMING, True, Metric.TPOT_MS, unit="ms"),
    Compared(Metric.E2E_MS, TIMING, True, Metric.E2E_MS, unit="ms"),
    Compared(Metric.DECODE_TOKENS_PER_S, TIMING, False, Metric.TPOT_MS, unit="tok/s"),
    Compared(Metric.PEAK_DEVICE_MEM_BYTES, MEMORY, True, unit="B"),
    Compared(Metric.PEAK_HOST_RSS_BYTES, MEMORY, True, unit="B"),
    Compared(Metric.KV_CACHE_BYTES, EXACT, True, unit="B"),
    Compared(Metric.TOKEN_AGREEMENT, QUALITY, False, floor=0.01),
    Compared(Metric.PASSKEY_ACCURACY, QUALITY, False, Metric.PASSKEY_ACCURACY),
    Compared(Metric.ANSWER_ACCURACY, QUALITY, False, Metric.ANSWER_ACCURACY),
    Compared(Metric.KL_DIVERGENCE, QUALITY, True, floor=0.01, unit="nats"),
)
BY_NAME = {c.name: c for c in COMPARED}


def value(metrics: Mapping[str, float], compared: Compared) -> float | None:
    found = metrics.get(compared.name)
    return None if found is None or math.isnan(found) else float(found)


def interval(metrics: Mapping[str, float], compared: Compared) -> Interval | None:
    """The metric's 95% interval; a point when it carries none. A rate borrows its time's interval
    inverted (tokens/s = k / TPOT, so its low end is at TPOT's high end)."""
    centre = value(metrics, compared)
    if centre is None:
        return None
    source = compared.interval_of
    found = metric_interval(metrics, source) if source else None  # the report's reading: a point without one
    if found is None:
        return centre, centre
    low, high = found
    if source == compared.name:
        return float(low), float(high)
    own = metrics.get(source)
    if not own or low <= 0 or low == high:
        return centre, centre
    return centre * own / high, centre * own / low
