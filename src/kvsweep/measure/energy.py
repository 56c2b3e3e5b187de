"""Joules per generated token over the measured phase, from NVML's total-energy counters (CUDA only).

Each of the cell's GPUs has a counter (millijoules since the driver loaded; Volta and newer), summed over a split
cell. Read around the measured phase, the energy is divided by the tokens of every measured call, kept or
discarded (all drew power); the pauses after a discarded call are read apart and left out. Each call is read too,
for the spread between repeats (a short call may fall between two counter updates). A counter is the whole GPU's:
another process adds its share. Where it cannot be read, the answer is why, never a number.
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


class EnergyReads:
    """The counter read safely by every energy meter of one phase: a failed reading is kept as the reason and
    every later read gives nothing, so one failure makes the phase's answer unknown, never the cell an error.
    `counter`: NVML's (`nvml_energy_counter`) or any function of each GPU's millijoules; a string: why none.
    """

    def __init__(self, counter: EnergyCounter | str) -> None:
        self.counter = counter
        self.failed: str | None = counter if isinstance(counter, str) else None

    def read(self) -> tuple[int, ...] | None:
        if self.failed is not None or isinstance(self.counter, str):
            return None
        try:
            return tuple(self.counter())
        except Exception as exc:  # NVML's error classes, or whatever a counter raises
            self.failed = f"the energy counter failed: {type(exc).__name__}: {exc}"
            return None


@dataclass(frozen=True)
class EnergySpan:
    """Each GPU's counter at a meter's start and at its stop (None: not read), and the counter's first
    failure as of the stop."""

    before: tuple[int, ...] | None
    after: tuple[int, ...] | None
    failed: str | None = None

    @property
    def spent_mj(self) -> int | None:
        """The cell's millijoules over the span, summed over its GPUs; None when either end was not read."""
        return sum(self.after) - sum(self.before) if self.before is not None and self.after is not None else None


class EnergyMeter:
    """A meter of the counter (`Meter[EnergySpan]`): the whole phase, one call, or one pause; the meters of
    one phase share their `EnergyReads`, and so its first failure."""

    def __init__(self, reads: EnergyReads) -> None:
        self.reads = reads
        self.before: tuple[int, ...] | None = None

    def start(self) -> None:
        self.before = self.reads.read()

    def stop(self) -> EnergySpan:
        after = self.reads.read()
        return EnergySpan(self.before, after, self.reads.failed)


def per_token(whole: EnergySpan, tokens: int, pauses: Sequence[EnergySpan] = ()) -> Energy:
    """Joules per token over the phase's span, less the `pauses` read apart, summed over the GPUs; or why not."""
    started, ended = whole.before, whole.after
    if whole.failed is not None:
        return Energy(unknown=whole.failed)
    if started is None or ended is None:
        return Energy(unknown="the energy counter was not read before the measured phase")
    if any(e < s for e, s in zip(ended, started, strict=True)):
        return Energy(unknown=f"the energy counter went backwards ({_mj(started)} mJ, then {_mj(ended)} mJ)")
    if tokens <= 0:
        return Energy(unknown="the measured calls generated no tokens")
    paused = [0] * len(started)
    for pause in pauses:
        if pause.before is not None and pause.after is not None and len(pause.after) == len(started):
            paused = [p + a - b for p, a, b in zip(paused, pause.after, pause.before, strict=True)]
    spent = [e - s - p for e, s, p in zip(ended, started, paused, strict=True)]
    return Energy(sum(spent) / 1000 / tokens, joules_per_gpu=tuple(mj / 1000 for mj in spent), tokens=tokens)


def phase_energy(
    whole: EnergySpan,
    pauses: Sequence[EnergySpan],
    kept_calls: Sequence[EnergySpan],
    phase: MeasuredPhase[T],
    tokens_of: Callable[[T], int],
) -> Energy:
    """The measured phase's figure (`per_token` over every measured call's tokens) with each kept call's own.

    `kept_calls`: each kept call's own span, in the order of `phase.kept`.
    """
    energy = per_token(whole, phase_tokens(phase, tokens_of), pauses)
    if energy.joules_per_token is None:
        return energy
    each = each_per_token(kept_calls, [tokens_of(sample.call) for sample in phase.kept])
    return Energy(energy.joules_per_token, None, energy.joules_per_gpu, energy.tokens, each)


def each_per_token(calls: Sequence[EnergySpan], tokens: Sequence[int]) -> tuple[float, ...]:
    """Each call's own joules per token, in their order; none when any could not be read."""
    figures = []
    for span, generated in zip(calls, tokens, strict=True):
        if span.spent_mj is None or generated <= 0:
            return ()
        figures.append(span.spent_mj / 1000 / generated)
    return tuple(figures)


def _mj(readings: Sequence[int]) -> str:
    return " + ".join(map(str, readings))


def phase_tokens(phase: MeasuredPhase[T], tokens_of: Callable[[T], int]) -> int:
    """Tokens every measured call generated, kept and discarded alike: each spent the energy."""
    return sum(tokens_of(sample.call) for sample in phase.kept + phase.discarded)
