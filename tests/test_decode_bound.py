"""Decode timings against the physical limit: the copy bandwidth and the plausibility rule."""

import time

import numpy as np
import pytest

from kvsweep.measure.bandwidth import Bandwidth, device_bandwidth
from kvsweep.measure.decode_bound import bandwidth_metrics, decode_weight_bytes, implausible

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


def test_utilization_is_bytes_over_time_over_bandwidth():
    metrics = bandwidth_metrics(bytes_per_token=2e9, tpot_ms=100.0, bandwidth=Bandwidth(40.0, 32 * MIB))
    assert metrics["decode_bandwidth_utilization"] == pytest.approx(0.5)  # 20 GB/s of 40
    assert "decode_bandwidth_utilization" not in bandwidth_metrics(2e9, 0.0, Bandwidth(40.0, None))  # no timing


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
