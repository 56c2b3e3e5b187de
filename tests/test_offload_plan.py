"""Offloaded caches on a GPU: the planner predicts their host memory and host-link time (issue 15).

Expectations are hand arithmetic on the published Llama-3.1-8B shape: 32 layers x 8 KV heads x
128 dims x 2 (K and V) x 2 bytes = 131,072 bytes of cache per token.
"""

import pytest
import torch

from kvsweep.caches import get_strategy
from kvsweep.grid import Cell
from kvsweep.measure.kv_bytes import cache_bytes
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.offload import HostLimits, estimate_offload
from kvsweep.plan.sweep_plan import model_facts

PER_TOKEN = 32 * 8 * 128 * 2 * 2
SHAPE = model_facts(["llama-3.1-8b"], False)[0]["llama-3.1-8b"].shape
TB = 10**12


def cell(cache: str, context: int, batch: int) -> Cell:
    return Cell("llama-3.1-8b", "bfloat16", context, batch, 128, cache, False)


def test_every_decoded_token_moves_the_whole_cache_there_and_back():
    estimate = estimate_offload(cell("offloaded", 130944, 4), get_strategy("offloaded"), SHAPE, 25.0, calls=9)
    mean_tokens = 130944 + 64  # the cache grows by one token per step: its mean length over 127 steps
    by_hand = 2 * PER_TOKEN * 4 * mean_tokens  # about 137 GB
    assert estimate.moved_bytes_per_token == pytest.approx(by_hand, rel=0.01)
    assert estimate.seconds_per_token == pytest.approx(by_hand / 25e9, rel=0.01)
    assert estimate.cell_seconds == pytest.approx(9 * 128 * by_hand / 25e9, rel=0.01)


def test_pinned_host_blocks_round_up_to_powers_of_two():
    # 131,071 cached tokens x 4 sequences: one layer's keys are 1,073,733,632 bytes, just under 2**30
    under = estimate_offload(cell("offloaded", 130944, 4), get_strategy("offloaded"), SHAPE, 25.0, calls=1)
    assert under.host_bytes == 2 * 30 * 2**30  # keys and values of the 30 layers not on the device
    # 2**18 + 1 tokens x 4 sequences: one layer's keys are just over 2**31 bytes, so blocks of 2**32
    over = estimate_offload(cell("offloaded", 2**18 + 2 - 128, 4), get_strategy("offloaded"), SHAPE, 25.0, calls=1)
    kv_on_host = 30 * 2 * (2**18 + 1) * 4 * 8 * 128 * 2
    assert over.host_bytes == 2 * 30 * 2**32 and over.host_bytes / kv_on_host == pytest.approx(2.0, rel=0.01)


def test_offloaded_cells_that_cannot_finish_or_fit_are_skipped_with_the_reason():
    roomy = HostLimits(memory_bytes=2 * TB, link_gbps=25.0, timeout_s=3600, calls=9)
    longest = plan_cell(cell("offloaded", 130944, 4), "cuda", SHAPE, host=roomy)
    assert not longest.runs and "predicted timeout" in longest.skip_reason and "137.4 GB" in longest.skip_reason
    assert plan_cell(cell("offloaded", 4096, 1), "cuda", SHAPE, host=roomy).runs  # 1 GB per token: seconds
    small_host = HostLimits(memory_bytes=32 * 10**9, link_gbps=25.0, timeout_s=10**9, calls=9)
    fat = plan_cell(cell("offloaded_static", 65536, 4), "cuda", SHAPE, host=small_host)
    assert not fat.runs and "predicted host oom" in fat.skip_reason
    assert plan_cell(cell("dynamic", 130944, 4), "cuda", SHAPE, host=small_host).offload is None


def test_the_long_context_sweep_plans_only_offloaded_cells_that_can_finish():
    from kvsweep.config.compose import compose_config
    from kvsweep.plan.sweep_plan import plan_sweep

    # an H200's memory, so no device-memory prediction depends on this machine's GPU
    overrides = ["+sweep=long_context", "planner.host_memory_gb=2000", "planner.device_memory_gb=141"]
    planned, _ = plan_sweep(compose_config(overrides).config, "cuda")
    offloaded = {(p.cell.cache, p.cell.context_length, p.cell.batch_size): p for p in planned if p.offload}
    # By hand: 9 calls (cold, warmup 2, repeats 5, quality) x 128 tokens, each moving the cache there and
    # back at 25 GB/s: 9 x 128 x 2 x 131,072 B x batch x (context + ~64) / 25e9 = 0.0121 s x batch x (context + 64).
    # The sweep's limit is 3600 s: batch x (context + 64) up to about 298,000 tokens. Batch 4 at 65,536 is
    # 262,400 (3,170 s) and runs; batch 4 at 130,944 is 524,032 (6,330 s) and is skipped; batch 1 always runs.
    too_slow = {(cache, 130944, 4) for cache in ("offloaded", "offloaded_static")}
    assert len(offloaded) == 2 * 6 * 2  # two offloaded caches x six contexts x two batch sizes
    assert {key for key, p in offloaded.items() if not p.runs} == too_slow
    for reason in (offloaded[key].skip_reason for key in too_slow):
        assert "predicted timeout" in reason and "ray.cell_timeout_s=3600" in reason


def test_a_cache_reports_device_and_host_bytes_apart():
    class Layer:
        def __init__(self) -> None:
            self.keys, self.values = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)  # 256 bytes each

    class Cache:
        def __init__(self) -> None:
            self.layers = [Layer(), Layer()]

    on_gpu_cell = cache_bytes(Cache(), "cuda")  # these host tensors are what an offloaded cache keeps off the GPU
    assert (on_gpu_cell.device, on_gpu_cell.host) == (0, 1024)
    on_cpu_cell = cache_bytes(Cache(), "cpu")  # on a CPU cell the host is the device
    assert (on_cpu_cell.device, on_cpu_cell.host, on_cpu_cell.total) == (1024, 0, 1024)
