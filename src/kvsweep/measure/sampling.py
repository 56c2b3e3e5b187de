"""The measured phase: how many calls, which ones count, and when to stop.

Rules, in order:
- a call during which others took more than the contention limit of the cell's CPUs is discarded
  and re-run after a pause that doubles while calls stay contended (a burst may pass), at most
  `max_discarded` times per cell; once that budget is spent, calls are kept whatever they saw (the
  verdict then says so);
- measuring goes on until there are at least `repeats` kept calls and `min_duration_s` of them;
- with a precision target, it goes on until the 95% intervals of TTFT, TPOT and end-to-end time
  are within +-target of their medians, or `repeat_cap` calls or `max_duration_s` are reached.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kvsweep.config.measure_config import MeasureConfig
from kvsweep.measure.contention import CallContention
from kvsweep.measure.meter import Meter
from kvsweep.measure.statistics import precise_enough
from kvsweep.measure.timing import TokenTimes

T = TypeVar("T")
# Brackets each call (`HostMeter` on a real host); None from `stop` means it could not tell.
CallMeter = Meter[CallContention | None]


@dataclass
class Sample(Generic[T]):
    call: T
    times: TokenTimes
    contention: CallContention | None  # None: the host's counters could not be read


@dataclass
class MeasuredPhase(Generic[T]):
    kept: list[Sample[T]] = field(default_factory=list)
    discarded: list[Sample[T]] = field(default_factory=list)
    target_met: bool | None = None  # None: no precision target was set

    def series(self) -> list[list[float]]:
        """TTFT, TPOT and end-to-end times of the kept calls (TPOT left out when calls decode nothing)."""
        times = [s.times for s in self.kept]
        out = [[t.ttft_ms for t in times], [t.e2e_ms for t in times]]
        if all(t.gaps_ms for t in times):
            out.append([t.tpot_ms for t in times])
        return out


def pause_after(times: TokenTimes, in_a_row: int) -> float:
    """How long to step aside after a contended call: about one call (at least 0.1 s), doubling with each
    contended call in a row so a burst can pass, at most 1 s."""
    return min(1.0, max(0.1, times.e2e_ms / 1000) * 2 ** (in_a_row - 1))


def measure_phase(
    call: Callable[[], T],
    times_of: Callable[[T], TokenTimes],
    rules: MeasureConfig,
    meter: CallMeter,
    sleep: Callable[[float], None] = time.sleep,
    max_contention: float | None = None,
) -> MeasuredPhase[T]:
    """The measured calls under the sweep's `measure` rules; `max_contention` replaces its
    `max_host_contention` (a niced cell tolerates no one: 0)."""
    phase: MeasuredPhase[T] = MeasuredPhase()
    cap = rules.repeat_cap
    limit = rules.max_host_contention if max_contention is None else max_contention
    started = time.perf_counter()
    kept_s = 0.0
    in_a_row = 0  # contended calls since the last kept one
    while True:
        n = len(phase.kept)
        if n >= rules.repeats:
            floor_met = kept_s >= rules.min_duration_s
            precise = rules.target_rel_ci > 0 and precise_enough(phase.series(), rules.target_rel_ci)
            out_of_time = rules.max_duration_s > 0 and time.perf_counter() - started >= rules.max_duration_s
            if floor_met and (rules.target_rel_ci <= 0 or precise):
                break
            if n >= cap or out_of_time:
                break
        meter.start()
        result = call()
        reading = meter.stop()
        sample = Sample(result, times_of(result), reading)
        if reading is not None and reading.over(limit) and len(phase.discarded) < rules.max_discarded:
            phase.discarded.append(sample)
            in_a_row += 1
            sleep(pause_after(sample.times, in_a_row))
            continue
        in_a_row = 0
        phase.kept.append(sample)
        kept_s += sample.times.e2e_ms / 1000
    if rules.target_rel_ci > 0:
        phase.target_met = precise_enough(phase.series(), rules.target_rel_ci)
    return phase
