"""Joules per generated token over the measured phase, from NVML's total-energy counter (CUDA only).

The counter (millijoules since the driver loaded; Volta and newer) is read before and after the measured
phase; every measured call consumed energy, kept or discarded, so the energy is divided by the tokens they
all generated. The pauses `measure_phase` takes after a discarded call are not calls: their energy is
read apart and left out. The counter is the whole GPU's: another process on it adds its share (the
cell's contention tag says whether one was seen).

Where it cannot be read (a CPU cell, no pynvml, a GPU without the counter, no NVML handle for the
GPU's UUID), the answer is why, never a number.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kvsweep.measure.sampling import MeasuredPhase

T = TypeVar("T")
EnergyCounter = Callable[[], int]  # the device's total energy so far, in millijoules


@dataclass(frozen=True)
class Energy:
    """Either the figure or why there is none."""

    joules_per_token: float | None = None
    unknown: str | None = None


def nvml_energy_counter(device: str, gpu_uuid: str | None) -> EnergyCounter | str:
    """NVML's counter for the cell's GPU (found by UUID: indices differ between processes), or why not."""
    if device != "cuda":
        return f"NVML's energy counter needs a CUDA device; this cell ran on {device}"
    if not gpu_uuid:
        return "the GPU's UUID is unknown, so NVML cannot find it"
    try:
        import pynvml
    except ImportError:
        return "pynvml is not installed"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    except pynvml.NVMLError as exc:
        return f"NVML has no handle for {gpu_uuid}: {exc}"
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError as exc:
        return f"NVML's energy counter cannot be read on this GPU (Volta and newer have one): {exc}"
    return lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


class EnergyMeter:
    """Brackets the measured phase: `start`, the phase (sleeping through `paused`), then `per_token`.

    `counter` is NVML's (`nvml_energy_counter`) or any function returning millijoules; a string is why
    there is no counter. A reading that fails makes the answer unknown, never the cell an error.
    """

    def __init__(self, counter: EnergyCounter | str) -> None:
        self.counter = counter
        self.started_mj: int | None = None
        self.paused_mj = 0
        self.failed: str | None = counter if isinstance(counter, str) else None

    def _read(self) -> int | None:
        if self.failed is not None or isinstance(self.counter, str):
            return None
        try:
            return self.counter()
        except Exception as exc:  # NVML's error classes, or whatever a counter raises
            self.failed = f"the energy counter failed: {type(exc).__name__}: {exc}"
            return None

    def start(self) -> None:
        self.started_mj = self._read()

    def paused(self, sleep: Callable[[float], None]) -> Callable[[float], None]:
        """`sleep` with the energy it spans read apart, to leave out of the phase's (`measure_phase`'s seam)."""

        def sleep_apart(seconds: float) -> None:
            before = self._read()
            sleep(seconds)
            after = self._read()
            if before is not None and after is not None:
                self.paused_mj += after - before

        return sleep_apart

    def per_token(self, tokens: int) -> Energy:
        """Joules per token since `start`, less the pauses; or why not."""
        ended_mj = self._read()
        if self.failed is not None:
            return Energy(unknown=self.failed)
        if self.started_mj is None or ended_mj is None:
            return Energy(unknown="the energy counter was not read before the measured phase")
        if ended_mj < self.started_mj:
            return Energy(unknown=f"the energy counter went backwards ({self.started_mj} mJ, then {ended_mj} mJ)")
        if tokens <= 0:
            return Energy(unknown="the measured calls generated no tokens")
        return Energy(joules_per_token=(ended_mj - self.started_mj - self.paused_mj) / 1000 / tokens)


def phase_tokens(phase: MeasuredPhase[T], tokens_of: Callable[[T], int]) -> int:
    """Tokens every measured call generated, kept and discarded alike: each spent the energy."""
    return sum(tokens_of(sample.call) for sample in phase.kept + phase.discarded)
