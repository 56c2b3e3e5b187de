"""Joules per generated token over the measured phase, from NVML's total-energy counters (CUDA only).

Each of the cell's GPUs has a counter (millijoules since the driver loaded; Volta and newer): a cell split
over two GPUs draws power on both, so the cell's energy is their sum. The counters are read before and
after the measured phase; every measured call consumed energy, kept or discarded, so the energy is divided
by the tokens they all generated. The pauses `measure_phase` takes after a discarded call are not calls:
their energy is read apart and left out. Each call is also read on its own (`each`), for the spread of
joules per token between repeats: a short call may fall between two updates of a counter. A counter is the
whole GPU's: another process on it adds its share (the cell's contention tag says whether one was seen).

Where it cannot be read (a CPU cell, no pynvml, NVML that cannot start, a GPU without the counter, no NVML
handle for a GPU's UUID), the answer is why, never a number.
"""

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvsweep.measure.sampling import MeasuredPhase

T = TypeVar("T")
EnergyCounter = Callable[[], Sequence[int]]  # each of the cell's GPUs' total energy so far, in millijoules
# How the reason begins when a GPU has no energy counter (a property of the GPU, not a failure to report).
NO_COUNTER = "NVML's energy counter cannot be read on"
NVML_DID_NOT_START = "NVML could not start"


@dataclass(frozen=True)
class Energy:
    """Either the figures or why there are none.

    `joules_per_gpu`: each GPU's energy over the measured phase (pauses left out), in the cell's device
    order; `tokens`: what every measured call generated; `joules_per_token_each`: each kept call's own.
    """

    joules_per_token: float | None = None
    unknown: str | None = None
    joules_per_gpu: tuple[float, ...] = ()
    tokens: int = 0
    joules_per_token_each: tuple[float, ...] = ()

    def record(self) -> dict[str, Any]:
        """samples.json's account of the figure: what it sums and divides, and each kept call's own."""
        if self.joules_per_token is None:
            return {}
        return {
            "joules_per_gpu": list(self.joules_per_gpu),
            "tokens": self.tokens,
            "joules_per_token_per_repeat": list(self.joules_per_token_each),
        }


def nvml_energy_counter(device: str, gpu_uuids: Sequence[str], nvml: Any = None) -> EnergyCounter | str:
    """NVML's counters for the cell's GPUs (found by UUID: indices differ between processes), or why not.

    `nvml`: the NVML bindings (`pynvml` unless given: the seam for tests).
    """
    if device != "cuda":
        return f"NVML's energy counter needs a CUDA device; this cell ran on {device}"
    if not gpu_uuids:
        return "the GPU's UUID is unknown, so NVML cannot find it"
    try:
        nvml = nvml or importlib.import_module("pynvml")
    except ImportError:
        return "pynvml is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"{NVML_DID_NOT_START}: {exc}"
    handles = []
    for uuid in gpu_uuids:
        try:
            handles.append(nvml.nvmlDeviceGetHandleByUUID(uuid))
        except nvml.NVMLError as exc:
            return f"NVML has no handle for {uuid}: {exc}"
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handles[-1])
        except nvml.NVMLError as exc:
            return f"{NO_COUNTER} {uuid} (Volta and newer have one): {exc}"
    return lambda: tuple(int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in handles)


class EnergyMeter:
    """Brackets the measured phase: `start`, the phase (its calls through `each`, sleeping through `paused`),
    then `per_token`.

    `counter` is NVML's (`nvml_energy_counter`) or any function returning each GPU's millijoules; a string
    is why there is no counter. A reading that fails makes the answer unknown, never the cell an error.
    """

    def __init__(self, counter: EnergyCounter | str) -> None:
        self.counter = counter
        self.started_mj: tuple[int, ...] | None = None
        self.paused_mj: tuple[int, ...] = ()
        self.calls: list[tuple[Any, int | None]] = []  # each call's result and the cell's energy it took
        self.failed: str | None = counter if isinstance(counter, str) else None

    def _read(self) -> tuple[int, ...] | None:
        if self.failed is not None or isinstance(self.counter, str):
            return None
        try:
            return tuple(self.counter())
        except Exception as exc:  # NVML's error classes, or whatever a counter raises
            self.failed = f"the energy counter failed: {type(exc).__name__}: {exc}"
            return None

    def start(self) -> None:
        self.started_mj = self._read()
        self.paused_mj = tuple(0 for _ in self.started_mj or ())

    def each(self, call: Callable[[], T]) -> Callable[[], T]:
        """`call` with the energy it spans read apart (`measure_phase`'s call), for each repeat's own figure."""

        def metered() -> T:
            before = self._read()
            result = call()
            after = self._read()
            spent = sum(after) - sum(before) if before is not None and after is not None else None
            self.calls.append((result, spent))
            return result

        return metered

    def paused(self, sleep: Callable[[float], None]) -> Callable[[float], None]:
        """`sleep` with the energy it spans read apart, to leave out of the phase's (`measure_phase`'s seam)."""

        def sleep_apart(seconds: float) -> None:
            before = self._read()
            sleep(seconds)
            after = self._read()
            if before is not None and after is not None and len(after) == len(self.paused_mj):
                self.paused_mj = tuple(p + a - b for p, a, b in zip(self.paused_mj, after, before, strict=True))

        return sleep_apart

    def per_token(self, tokens: int) -> Energy:
        """Joules per token since `start`, less the pauses, summed over the GPUs; or why not."""
        ended_mj = self._read()
        if self.failed is not None:
            return Energy(unknown=self.failed)
        if self.started_mj is None or ended_mj is None:
            return Energy(unknown="the energy counter was not read before the measured phase")
        if any(e < s for e, s in zip(ended_mj, self.started_mj, strict=True)):
            then = f"{_mj(self.started_mj)} mJ, then {_mj(ended_mj)} mJ"
            return Energy(unknown=f"the energy counter went backwards ({then})")
        if tokens <= 0:
            return Energy(unknown="the measured calls generated no tokens")
        spent = [e - s - p for e, s, p in zip(ended_mj, self.started_mj, self.paused_mj, strict=True)]
        return Energy(sum(spent) / 1000 / tokens, joules_per_gpu=tuple(mj / 1000 for mj in spent), tokens=tokens)

    def each_per_token(self, kept: Sequence[Any], tokens_of: Callable[[Any], int]) -> tuple[float, ...]:
        """Each kept call's own joules per token, in their order; none when any could not be read."""
        spent = {id(result): mj for result, mj in self.calls}
        figures = []
        for call in kept:
            mj, tokens = spent.get(id(call)), tokens_of(call)
            if mj is None or tokens <= 0:
                return ()
            figures.append(mj / 1000 / tokens)
        return tuple(figures)


def phase_energy(meter: EnergyMeter, phase: MeasuredPhase[T], tokens_of: Callable[[T], int]) -> Energy:
    """The measured phase's figure (`per_token` over every measured call's tokens) with each kept call's own."""
    energy = meter.per_token(phase_tokens(phase, tokens_of))
    if energy.joules_per_token is None:
        return energy
    each = meter.each_per_token([sample.call for sample in phase.kept], tokens_of)
    return Energy(energy.joules_per_token, None, energy.joules_per_gpu, energy.tokens, each)


def _mj(readings: Sequence[int]) -> str:
    return " + ".join(map(str, readings))


def phase_tokens(phase: MeasuredPhase[T], tokens_of: Callable[[T], int]) -> int:
    """Tokens every measured call generated, kept and discarded alike: each spent the energy."""
    return sum(tokens_of(sample.call) for sample in phase.kept + phase.discarded)
