"""The measured phase with every meter in its one place: the phase meters around the whole phase, the call
meters around each call, the energy of each pause read apart.

Phase meters start in this order and stop in reverse: `SharingProbe` (which first waits for others to leave the
GPUs), then the energy counter. Around each call the host's CPUs outside (`measure_phase` holds that meter: it
decides whether the call is kept), the call's energy inside; peak memory around `generate` alone
(`GenerateSession.call`).
"""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kvsweep.config.measure_config import MeasureConfig
from kvsweep.measure.energy import Energy, EnergyCounter, EnergyMeter, EnergyReads, EnergySpan, phase_energy
from kvsweep.measure.gpu_sharing import GpuSharing, SharingProbe
from kvsweep.measure.sampling import CallMeter, MeasuredPhase, TokenTimes, measure_phase

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


def compile_events() -> int:
    """Graphs compiled plus CUDA graphs recorded so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]) + cudagraphs_recorded()


def cudagraphs_recorded() -> int:
    """Recordings held by Inductor's CUDA graph trees on every device (0 where none were made)."""
    try:
        import torch
        from torch._inductor import cudagraph_trees as trees

        if not torch._C._is_key_in_tls("tree_manager_containers"):
            return 0
        containers: dict[int, Any] = trees.get_obj(trees.local, "tree_manager_containers")
    except Exception:  # another torch's internals: no recordings can be counted
        return 0
    total = 0
    for container in list(containers.values()):
        manager = getattr(container, "tree_manager", None)
        if manager is not None and manager.roots is not None:
            total += sum(_nodes(node) for nodes in manager.roots.values() for node in nodes)
    return total


def _nodes(node: Any) -> int:
    return 1 + sum(_nodes(child) for children in node.children.values() for child in children)


def cudagraph_skips(counters: Mapping[str, Mapping[str, int]] | None = None) -> int:
    """Graphs Inductor chose to run without CUDA graphs so far in this process.

    `counters`: torch's counters (`torch._dynamo.utils.counters` when None), by group then name.
    """
    if counters is None:
        from torch._dynamo.utils import counters as torch_counters

        counters = torch_counters
    return int(counters.get("inductor", {}).get("cudagraph_skips", 0))
