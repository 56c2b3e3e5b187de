"""Joules per token: the arithmetic through the meter's counter seam, and why a figure is missing.

The counter is a function returning each GPU's millijoules, passed in (NVML's on a GPU); the measured
phase is the real `PhaseMeters.measure` (and `measure_phase` under it) with its call, host meter and sleep
scripted, so every figure is worked out by hand. NVML's own counter is read through a stand-in for its
bindings (`fake_nvml.py`): a cell over two GPUs sums both. A real CPU cell's "unknown" tag is checked
through `run_cell` in test_memory_limit.py.
"""

import pytest
import torch

from fake_nvml import FakeGpu, FakeNvml
from kvsweep.config.measure_config import MeasureConfig
from kvsweep.grid import RULES_OFF
from kvsweep.measure.energy import (
    NO_COUNTER,
    NVML_DID_NOT_START,
    EnergyMeter,
    EnergyReads,
    nvml_energy_counter,
    per_token,
    phase_tokens,
)
from kvsweep.measure.gpu_sharing import SharingProbe
from kvsweep.measure.phase_meters import PhaseMeters
from kvsweep.measure.sampling import TokenTimes, measure_phase
from test_sampling import BUSY, QUIET, ScriptedMeter  # what others took of the CPUs, scripted per call


def readings(*values):
    """One GPU's counter, reading `values` in turn."""
    script = iter(values)
    return lambda: (next(script),)


def energy_over(counter, tokens):
    """One energy meter started and stopped at once on `counter`, and the joules per token between."""
    meter = EnergyMeter(EnergyReads(counter))
    meter.start()
    return per_token(meter.stop(), tokens)


def phase_meters(counter, host, sleep=lambda _: None):
    """The phase's meters off CUDA (no GPU to probe), with the energy counter and host meter given."""
    return PhaseMeters(SharingProbe(()), counter, host, sleep)


def test_joules_per_token_is_the_counters_difference_over_the_tokens():
    # 600 000 mJ = 600 J over 4 x 32 + 4 x 32 = 256 tokens
    assert energy_over(readings(1_000_000, 1_600_000), 4 * 32 + 4 * 32).joules_per_token == 600 / 256 == 2.34375


class Gpu:
    """A device whose energy counter each call advances by 300 J and each pause by 50 J."""

    def __init__(self):
        self.mj = 1_000_000
        self.calls = 0

    def read(self):
        return (self.mj,)

    def call(self):
        self.mj += 300_000
        self.calls += 1
        return torch.zeros(4, 32, dtype=torch.long)  # batch 4 x 32 new tokens

    def sleep(self, _seconds):
        self.mj += 50_000


def guarded(repeats, max_discarded):
    """Exactly `repeats` kept calls; a call during which others took over 10% of the CPUs is re-run."""
    return MeasureConfig(
        **{**RULES_OFF, "repeats": repeats, "max_host_contention": 0.1, "max_discarded": max_discarded}
    )


def test_discarded_calls_count_and_the_pause_after_them_does_not():
    gpu = Gpu()
    rules = guarded(repeats=1, max_discarded=1)
    meters = phase_meters(gpu.read, ScriptedMeter([BUSY, QUIET]), gpu.sleep)
    metered = meters.measure(gpu.call, lambda _: TokenTimes(1.0, [1.0], 2.0), lambda ids: ids.numel(), rules)
    phase = metered.phase
    # The first call is discarded (others took half the CPUs), one pause, the second is kept.
    assert (len(phase.discarded), len(phase.kept), gpu.calls) == (1, 1, 2)
    tokens = phase_tokens(phase, lambda ids: ids.numel())
    assert tokens == metered.energy.tokens == 2 * 4 * 32
    # 2 calls x 300 J; the 50 J pause left out
    assert metered.energy.joules_per_token == pytest.approx(600 / 256)
    assert metered.energy.joules_per_token_each == pytest.approx((300 / 128,))  # the kept call's own


def test_no_counter_gives_the_reason_not_a_number():
    energy = energy_over("pynvml is not installed", 256)
    assert energy.joules_per_token is None and energy.unknown == "pynvml is not installed"


def test_a_counter_that_fails_or_goes_backwards_gives_no_figure():
    def broken():
        raise OSError("gone")

    assert energy_over(broken, 256).unknown == "the energy counter failed: OSError: gone"
    # the driver reloaded between the readings
    backwards = energy_over(readings(5_000, 1_000), 256)
    assert backwards.unknown == "the energy counter went backwards (5000 mJ, then 1000 mJ)"
    assert energy_over(readings(1_000, 2_000), 0).joules_per_token is None


def test_a_counter_that_fails_during_one_call_leaves_the_whole_phase_unknown():
    gpu = Gpu()
    answers = iter([gpu.read, gpu.read, gpu.read, lambda: 1 / 0])  # the second call's first reading fails

    def read():
        return next(answers, gpu.read)()

    meters = phase_meters(read, ScriptedMeter([QUIET] * 2))
    metered = meters.measure(gpu.call, lambda _: TokenTimes(1.0, [1.0], 2.0), lambda ids: ids.numel(), guarded(2, 0))
    assert metered.energy.unknown == "the energy counter failed: ZeroDivisionError: division by zero"


def test_nvml_is_asked_only_for_a_cuda_device_and_found_by_uuid():
    assert nvml_energy_counter("cpu", ()) == "NVML's energy counter needs a CUDA device; this cell ran on cpu"
    assert "UUID" in nvml_energy_counter("cuda", ())
    # Here the real pynvml finds no NVML library: that is NVML not starting, said as such.
    missing = nvml_energy_counter("cuda", ("GPU-00000000-0000-0000-0000-000000000000",))
    assert isinstance(missing, str) and missing.startswith(NVML_DID_NOT_START)
    gpus = FakeNvml([FakeGpu("GPU-a")])
    assert nvml_energy_counter("cuda", ("GPU-zzz",), gpus) == "NVML has no handle for GPU-zzz: Not Found"


def test_tokens_are_counted_over_kept_and_discarded_calls_alike():
    gpu = Gpu()
    rules = guarded(repeats=2, max_discarded=3)
    script = ScriptedMeter([BUSY, QUIET, BUSY, QUIET])
    phase = measure_phase(gpu.call, lambda _: TokenTimes(1.0, [1.0], 2.0), rules, script, lambda _: None)
    assert phase_tokens(phase, lambda ids: ids.numel()) == 4 * (4 * 32)


class SplitCell:
    """A cell over two GPUs: each call draws 300 J on the first and 100 J on the second (which holds the
    later layers), each pause 50 J and 10 J; the counters are NVML's, through its bindings' stand-in."""

    def __init__(self, second_counter: bool = True):
        self.first = FakeGpu("GPU-a", energy_mj=1_000_000)
        self.second = FakeGpu("GPU-b", energy_mj=5_000_000 if second_counter else None)
        self.nvml = FakeNvml([self.first, self.second])

    def call(self):
        self.first.energy_mj += 300_000
        self.second.energy_mj += 100_000
        return torch.zeros(4, 32, dtype=torch.long)

    def sleep(self, _seconds):
        self.first.energy_mj += 50_000
        self.second.energy_mj += 10_000


def test_a_split_cells_energy_is_both_gpus_together():
    cell = SplitCell()
    counter = nvml_energy_counter("cuda", ("GPU-a", "GPU-b"), cell.nvml)
    host = ScriptedMeter([BUSY, QUIET, QUIET])  # the first call discarded, one pause, two kept
    meters = phase_meters(counter, host, cell.sleep)
    rules = guarded(repeats=2, max_discarded=1)
    energy = meters.measure(cell.call, lambda _: TokenTimes(1.0, [1.0], 2.0), lambda ids: ids.numel(), rules).energy
    # 3 calls x (300 + 100) J over 3 x 128 tokens; the pause's 60 J left out
    assert energy.joules_per_gpu == (900.0, 300.0)
    assert energy.tokens == 3 * 128
    assert energy.joules_per_token == pytest.approx(1200 / 384)
    assert energy.joules_per_token_each == pytest.approx((400 / 128, 400 / 128))  # the kept calls, each
    assert energy.record() == {
        "joules_per_gpu": [900.0, 300.0],
        "tokens": 384,
        "joules_per_token_per_repeat": list(energy.joules_per_token_each),
    }


def test_each_repeats_own_figure_follows_what_it_drew():
    gpu = Gpu()
    draws = iter([300_000, 600_000])  # the second call draws twice the first's 300 J

    def call():
        gpu.mj += next(draws)
        return torch.zeros(4, 32, dtype=torch.long)

    rules = guarded(repeats=2, max_discarded=0)
    meters = phase_meters(gpu.read, ScriptedMeter([QUIET] * 2))
    energy = meters.measure(call, lambda _: TokenTimes(1.0, [1.0], 2.0), lambda ids: ids.numel(), rules).energy
    assert energy.joules_per_token_each == pytest.approx((300 / 128, 600 / 128))
    assert energy.joules_per_token == pytest.approx(900 / 256)


def test_a_split_cell_whose_second_gpu_has_no_counter_says_which():
    cell = SplitCell(second_counter=False)
    found = nvml_energy_counter("cuda", ("GPU-a", "GPU-b"), cell.nvml)
    assert isinstance(found, str) and found.startswith(f"{NO_COUNTER} GPU-b") and found.endswith("Not Supported")


def test_nvml_that_cannot_start_is_told_apart_from_a_gpu_without_the_counter():
    found = nvml_energy_counter("cuda", ("GPU-a",), FakeNvml([FakeGpu("GPU-a")], starts=False))
    assert found == f"{NVML_DID_NOT_START}: Driver Not Loaded"
