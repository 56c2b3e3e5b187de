"""The measured phase with every meter in its one place: the phase meters around the whole phase, the call
meters around each call, the energy of each pause read apart.

Phase meters start in this order and stop in the reverse: who else is on the cell's GPUs (`SharingProbe`,
which first waits for them to leave), then the energy counter. Around each call, the host's CPUs outside
(`measure_phase` holds that meter: its reading decides whether the call is kept), the call's own energy
inside. A call's peak memory is read within the call (`GenerateSession.call`), around `generate` alone.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvsweep.config.measure_config import MeasureConfig
from kvsweep.measure.energy import Energy, EnergyCounter, EnergyMeter, EnergyReads, EnergySpan, phase_energy
from kvsweep.measure.gpu_sharing import GpuSharing, SharingProbe
from kvsweep.measure.sampling import CallMeter, MeasuredPhase, measure_phase
from kvsweep.measure.timing import TokenTimes

T = TypeVar("T")


@dataclass(frozen=True)
class MeteredPhase(Generic[T]):
    """The measured calls, and what the phase meters read around them."""

    phase: MeasuredPhase[T]
    energy: Energy
    gpus: GpuSharing


@dataclass
class PhaseMeters:
    """The meters of one measured phase.

    `gpus`: the cell's GPUs (none off CUDA); `energy_counter`: their energy counter, or why there is none;
    `host`: the host's CPUs, around each call; `sleep`: the pause after a discarded call (a seam for tests).
    """

    gpus: SharingProbe
    energy_counter: EnergyCounter | str
    host: CallMeter
    sleep: Callable[[float], None] = time.sleep

    def measure(
        self,
        call: Callable[[], T],
        times_of: Callable[[T], TokenTimes],
        tokens_of: Callable[[T], int],
        rules: MeasureConfig,
        max_contention: float | None = None,
    ) -> MeteredPhase[T]:
        """`measure_phase` under every meter; `max_contention` as there (a niced cell tolerates no one: 0)."""
        reads = EnergyReads(self.energy_counter)  # every energy meter of the phase: one counter, one failure
        call_energy: dict[int, EnergySpan] = {}  # by the call's result, kept and discarded alike
        pauses: list[EnergySpan] = []

        def metered_call() -> T:
            result, spent = _with_energy(reads, call)
            call_energy[id(result)] = spent
            return result

        def pause(seconds: float) -> None:
            pauses.append(_with_energy(reads, lambda: self.sleep(seconds))[1])

        whole = EnergyMeter(reads)
        self.gpus.start()
        whole.start()
        phase = measure_phase(metered_call, times_of, rules, self.host, pause, max_contention)
        spent = whole.stop()
        gpus = self.gpus.stop()
        kept = [call_energy[id(sample.call)] for sample in phase.kept]
        return MeteredPhase(phase, phase_energy(spent, pauses, kept, phase, tokens_of), gpus)


def _with_energy(reads: EnergyReads, work: Callable[[], T]) -> tuple[T, EnergySpan]:
    """`work`'s result and the energy it spans, read apart."""
    meter = EnergyMeter(reads)
    meter.start()
    result = work()
    return result, meter.stop()
