"""The measured phase: how many calls, which ones count, and when to stop.

A contended call is discarded and re-run after a pause that doubles while calls stay contended (a burst may pass),
at most `max_discarded` times per cell, then kept whatever it saw (the verdict says so). Measuring goes on to at
least `repeats` kept calls and `min_duration_s`; with a precision target, until the 95% intervals of TTFT, TPOT and
end-to-end time are within +-target of their medians, or `repeat_cap` calls or `max_duration_s`.

Every meter has one shape (`Meter`): `start` before what it measures, `stop` after, returning a plain reading. Call
meters bracket each call (`contention.py`, `energy.py`, `peak_memory.py`), phase meters the whole phase
(`gpu_sharing.py`, the phase's energy); `phase_meters.py` composes them.
"""

import inspect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import torch
from transformers import LogitsProcessor

from kvsweep.config.measure_config import MeasureConfig
from kvsweep.grid import Cell
from kvsweep.measure.contention import CallContention
from kvsweep.measure.peak_memory import PeakMemory
from kvsweep.measure.statistics import interval_metrics, median, percentile, precise_enough
from kvsweep.names import Metric

Reading = TypeVar("Reading", covariant=True)


class Meter(Protocol[Reading]):
    """Brackets one stretch of work: `start` before it, `stop` after it, returning what was read."""

    def start(self) -> None: ...

    def stop(self) -> Reading: ...


def _no_sync() -> None:
    pass


class TokenClock(LogitsProcessor):
    """Records a timestamp (ns) per generated token; `sync` (the device's synchronize) runs first so
    queued accelerator work is counted in the token it belongs to."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync or _no_sync
        self.start_ns = 0
        self.stamps_ns: list[int] = []

    def start(self) -> None:
        self.sync()
        self.stamps_ns = []
        self.start_ns = time.perf_counter_ns()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.sync()
        self.stamps_ns.append(time.perf_counter_ns())
        return scores

    # transformers' LogitsProcessorList calls inspect.signature(processor.__call__) on every token;
    # a precomputed signature makes that ~3x cheaper (set below the class).

    def stop(self) -> int:
        """Ends the call; returns its end time (ns)."""
        self.sync()
        return time.perf_counter_ns()


TokenClock.__call__.__signature__ = inspect.signature(TokenClock.__call__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class TokenTimes:
    """One generate call, in milliseconds."""

    ttft_ms: float
    gaps_ms: list[float]  # one per decoded token after the first
    e2e_ms: float

    @property
    def decode_ms(self) -> float:
        return sum(self.gaps_ms)

    @property
    def tpot_ms(self) -> float:
        return self.decode_ms / len(self.gaps_ms) if self.gaps_ms else float("nan")

    @classmethod
    def from_clock(cls, start_ns: int, stamps_ns: list[int], end_ns: int) -> "TokenTimes":
        if not stamps_ns:
            raise RuntimeError("generate produced no tokens; nothing to time")
        ms = 1e-6
        gaps = [(b - a) * ms for a, b in itertools.pairwise(stamps_ns)]
        return cls((stamps_ns[0] - start_ns) * ms, gaps, (end_ns - start_ns) * ms)


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


def summarize_runs(runs: list[tuple[TokenTimes, PeakMemory]], cell: Cell) -> dict[str, float]:
    """Medians over repeats with their 95% intervals (`*_ci_low/high`); `tpot_ms_p90` is the 90th
    percentile of every decode gap (token tail)."""
    times = [t for t, _ in runs]
    ttft = [t.ttft_ms for t in times]
    tpot = [t.tpot_ms for t in times]
    decode_rate = [cell.batch_size * len(t.gaps_ms) / (t.decode_ms / 1e3) for t in times if t.decode_ms > 0]
    prefill_rate = [cell.batch_size * cell.context_length / (t.ttft_ms / 1e3) for t in times]
    metrics = {
        Metric.TTFT_MS: median(ttft),
        Metric.TTFT_MS_P90: percentile(ttft, 90),
        Metric.TPOT_MS: median(tpot),
        Metric.TPOT_MS_P90: percentile([g for t in times for g in t.gaps_ms], 90),
        Metric.PREFILL_TOKENS_PER_S: median(prefill_rate),
        Metric.E2E_MS: median([t.e2e_ms for t in times]),
        Metric.PEAK_HOST_RSS_BYTES: median([float(p.host_rss_bytes) for _, p in runs]),
        Metric.REPEATS: float(len(runs)),
    }
    metrics |= interval_metrics(Metric.TTFT_MS, ttft) | interval_metrics(Metric.E2E_MS, [t.e2e_ms for t in times])
    if all(t.gaps_ms for t in times):
        metrics |= interval_metrics(Metric.TPOT_MS, tpot)
    if decode_rate:
        metrics[Metric.DECODE_TOKENS_PER_S] = median(decode_rate)
    device_peaks = [float(p.device_bytes) for _, p in runs if p.device_bytes is not None]
    if device_peaks:
        metrics[Metric.PEAK_DEVICE_MEM_BYTES] = median(device_peaks)
    return metrics
