"""Decode timings against the physical limit: the copy bandwidth and the plausibility rule."""

import time

import numpy as np
import pytest

from kvsweep.measure.bandwidth import (
    COPY_PLANS,
    COPY_ROUNDS,
    Bandwidth,
    bandwidth_metrics,
    copy_bandwidth_gbps,
    decode_weight_bytes,
    device_bandwidth,
    implausible,
)

MIB = 1 << 20


def numpy_copy_gbps(size: int = 128 * MIB, rounds: int = 5) -> float:
    """A hand-timed copy with numpy (single thread, as the test cells run), best of a few."""
    src = np.ones(size // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return 2 * size / best / 1e9


def test_cpu_copy_bandwidth_agrees_with_a_hand_timed_copy():
    import torch

    torch.set_num_threads(1)
    measured = device_bandwidth("cpu").gbps
    reference = numpy_copy_gbps()
    assert 0.33 < measured / reference < 3.0, (measured, reference)  # same order: a shared, noisy host


class ScriptedStopwatch:
    """A fake event pair: each reading returns the next scripted time and records how many copies it enclosed."""

    def __init__(self, copies_done: list[int], seconds: list[float]):
        self.copies_done, self.seconds, self.enclosed = copies_done, list(seconds), []

    def start(self) -> None:
        self._at_start = self.copies_done[0]

    def stop(self) -> float:
        self.enclosed.append(self.copies_done[0] - self._at_start)
        return self.seconds.pop(0)


def test_copy_bandwidth_is_read_plus_written_bytes_of_every_copy_in_the_best_reading():
    copies_done = [0]

    def copy() -> None:
        copies_done[0] += 1

    stopwatch = ScriptedStopwatch(copies_done, [3.0e-3, 2.2e-3, 2.5e-3])
    gbps = copy_bandwidth_gbps(copy, 256 * MIB, stopwatch, copies=16, rounds=3)
    # 16 copies of 256 MiB, each read once and written once, in the fastest reading's 2.2 ms
    assert gbps == pytest.approx(2 * 268_435_456 * 16 / 2.2e-3 / 1e9)
    assert stopwatch.enclosed == [16, 16, 16]
    assert copies_done[0] == 1 + 3 * 16  # one untimed warm-up copy before the first reading


class HostSyncedDevice:
    """A simulated GPU whose every reading pays a launch and a host sync on top of the copies it times."""

    COPY_S = 130e-6  # one 256 MiB device-to-device copy on a recent GPU
    LAUNCH_AND_SYNC_S = 20e-6

    def __init__(self) -> None:
        self.clock = 0.0

    def copy(self) -> None:
        self.clock += self.COPY_S

    def start(self) -> None:
        self._started = self.clock

    def stop(self) -> float:
        return self.clock - self._started + self.LAUNCH_AND_SYNC_S


def test_a_cuda_reading_times_enough_copies_that_launch_and_sync_cost_under_one_percent():
    def measured_share(copies: int) -> float:
        device = HostSyncedDevice()
        gbps = copy_bandwidth_gbps(device.copy, 256 * MIB, device, copies=copies, rounds=COPY_ROUNDS)
        return gbps / (2 * 256 * MIB / HostSyncedDevice.COPY_S / 1e9)

    assert measured_share(1) < 0.9  # one copy between syncs: 130 of 150 µs, the old benchmark's 13% low
    assert 0.99 < measured_share(COPY_PLANS["cuda"].copies_per_reading) < 1.0


def test_utilization_is_bytes_over_time_over_bandwidth():
    metrics = bandwidth_metrics(bytes_per_token=2e9, tpot_ms=100.0, bandwidth=Bandwidth(40.0, 32 * MIB))
    assert metrics["decode_bandwidth_utilization"] == pytest.approx(0.5)  # 20 GB/s of 40
    assert "decode_bandwidth_utilization" not in bandwidth_metrics(2e9, 0.0, Bandwidth(40.0, None))  # no timing


def test_host_link_bytes_are_reported_beside_device_bytes_and_never_enter_utilization():
    offloaded = bandwidth_metrics(
        2e9, tpot_ms=100.0, bandwidth=Bandwidth(40.0, 32 * MIB), host_link_bytes_per_token=6e9
    )
    assert offloaded["decode_host_link_bytes_per_token"] == 6e9
    assert offloaded["decode_bandwidth_utilization"] == pytest.approx(0.5)  # still 2 GB in 100 ms of 40 GB/s
    assert bandwidth_metrics(2e9, 100.0, Bandwidth(40.0, None))["decode_host_link_bytes_per_token"] == 0.0


@pytest.mark.parametrize("tied", [False, True])
def test_a_decode_step_reads_every_matrix_but_only_rows_of_an_untied_input_embedding(tied):
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvsweep.models.presets import PRESETS

    preset = PRESETS["tiny-llama"]
    config = AutoConfig.for_model(preset.model_type, **{**preset.config, "tie_word_embeddings": tied})
    model = AutoModelForCausalLM.from_config(config)  # float32: 4 bytes a parameter
    # By hand from tiny-llama's shape (hidden 128, 4 heads of 32, 2 KV heads, MLP 256, 4 layers, vocabulary
    # 1024), per layer: q and o 128x128 each, k and v 128x64 each, gate, up and down 128x256 each, two norms of
    # 128. Then the final norm and the 1024x128 output matrix (the lm_head, or the tied table it reads whole);
    # an untied input table is only looked up, not read.
    per_layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128
    assert decode_weight_bytes(model) == 4 * (4 * per_layer + 128 + 1024 * 128)


def test_faster_than_memory_is_implausible_only_for_bytes_no_cache_can_hold():
    bandwidth = Bandwidth(gbps=10.0, last_level_cache_bytes=32 * MIB)
    too_fast = bandwidth_metrics(1 << 30, tpot_ms=10.0, bandwidth=bandwidth)  # 107 GB/s from a 10 GB/s memory
    assert implausible(too_fast, bandwidth)
    in_cache = bandwidth_metrics(64 * MIB, tpot_ms=0.5, bandwidth=bandwidth)  # fast, but 2x the LLC could be hot
    assert in_cache["decode_bandwidth_utilization"] > 1.05 and not implausible(in_cache, bandwidth)
    at_limit = bandwidth_metrics(1 << 30, tpot_ms=1e3 * (1 << 30) / 10e9, bandwidth=bandwidth)
    assert not implausible(at_limit, bandwidth)
    unknown = Bandwidth(gbps=10.0, last_level_cache_bytes=None)
    assert not implausible(bandwidth_metrics(1 << 30, 10.0, unknown), unknown)  # no cache size: no verdict


def test_a_decode_step_reads_quantized_weights_as_stored_not_at_their_nominal_size():
    """quanto keeps a frozen int8 weight as a float32-typed Parameter of the original shape: counted by
    `numel() * element_size()` it weighs as much as the float32 matrix, 4x what memory holds."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvsweep.models.presets import PRESETS
    from kvsweep.models.quantize_weights import quantize_built_model
    from kvsweep.models.weight_schemes import weight_scheme

    preset = PRESETS["tiny-llama"]
    config = AutoConfig.for_model(preset.model_type, **{**preset.config, "tie_word_embeddings": False})
    model = AutoModelForCausalLM.from_config(config)  # float32
    quantize_built_model(model, weight_scheme("quanto-int8"))

    def int8_linear(n_in: int, n_out: int) -> int:  # int8 matrix, a float32 scale per row, two float32 scalars
        return n_out * n_in + n_out * 4 + 2 * 4

    per_layer = 2 * int8_linear(128, 128) + 2 * int8_linear(128, 64) + 2 * int8_linear(128, 256)
    per_layer += int8_linear(256, 128) + 2 * 128 * 4  # down_proj; two float32 norms
    head = 1024 * 128 * 4  # the lm_head stays float32 (Transformers never quantizes the output layer)
    assert decode_weight_bytes(model) == 4 * per_layer + 128 * 4 + head
    nominal = sum(p.numel() * p.element_size() for p in model.parameters()) - 1024 * 128 * 4
    assert nominal > 2.5 * (4 * per_layer)  # what the count by shape and dtype claimed
