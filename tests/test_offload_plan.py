"""Offloaded caches on a GPU: the planner predicts their pinned host memory and host-link time.

Expectations are hand arithmetic on the published Llama-3.1-8B shape: 32 layers x 8 KV heads x
128 dims x 2 (K and V) x 2 bytes = 131,072 bytes of cache per token, and one layer's keys (or
values) are 8 x 128 x 2 = 2,048 bytes per token.
"""

import itertools
import math

import pytest
import torch

from kvsweep.caches import get_strategy
from kvsweep.config.measure_config import MeasureConfig
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.inputs.spec import InputSpec
from kvsweep.measure.cache_identity import cache_bytes
from kvsweep.measure.contention import CallContention
from kvsweep.measure.sampling import TokenTimes, measure_phase
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.kv_prediction import decode_kv_traffic
from kvsweep.plan.offload import HostLimits, estimate_offload, most_measured, worst_case_calls
from kvsweep.plan.sweep_plan import model_facts

PER_TOKEN = 32 * 8 * 128 * 2 * 2
ONE_TENSOR_PER_TOKEN = 8 * 128 * 2  # one layer's keys, or its values
SHAPE = model_facts(["llama-3.1-8b"], False)[0]["llama-3.1-8b"].shape
TB = 10**12
LINK = 25e9  # bytes per second
# The long_context sweep's measurement (conf/measure/slow_calls.yaml over the schema's defaults).
LONG_CONTEXT = MeasureProtocol(
    MeasureConfig(
        warmup=2,
        repeats=5,
        seed=0,
        threads=0,
        min_duration_s=2.0,
        max_repeats=30,
        max_host_contention=0.05,
        max_discarded=8,
        target_rel_ci=0.0,
        max_duration_s=60.0,
        quality_trials=0,
        device_memory_limit_gb=0.0,
    ),
    device="cuda",
    inputs=InputSpec(depths=(0.1, 0.5, 0.9), chat_template=True, quality_trials=0),
    gpus=1,
    workload=None,
)


def cell(cache: str, context: int, batch: int) -> Cell:
    return Cell("llama-3.1-8b", "bfloat16", context, batch, 128, cache, False)


def protocol(**changed: float) -> MeasureProtocol:
    return LONG_CONTEXT.with_measure(**changed)


def test_every_decoded_token_moves_the_whole_cache_there_and_back():
    estimate = estimate_offload(cell("offloaded", 130944, 4), get_strategy("offloaded"), SHAPE, 25.0, LONG_CONTEXT)
    # Step j (1 .. 127) brings each layer in at 130,944 + j - 1 tokens and sends it back at 130,944 + j:
    # 2 x 130,944 + 2j - 1 tokens; over j = 1 .. 127 the mean of 2j - 1 is 127 (the mean of j is 64).
    mean_tokens = 2 * 130944 + 127
    by_hand = PER_TOKEN * 4 * mean_tokens  # 524,288 B x 262,015 = 137.4 GB
    assert estimate.moved_bytes_per_token == pytest.approx(by_hand, rel=1e-12)
    assert estimate.seconds_per_token == pytest.approx(by_hand / LINK, rel=1e-12)


def test_the_planner_predicts_the_host_link_bytes_the_cell_reports():
    """One model of the link: the planner's bytes per token are the cell's `decode_host_link_bytes_per_token`."""
    for cache in ("offloaded", "offloaded_static"):
        strategy = get_strategy(cache)
        estimate = estimate_offload(cell(cache, 4096, 2), strategy, SHAPE, 25.0, LONG_CONTEXT)
        reported = decode_kv_traffic(strategy, SHAPE, 2, "bfloat16", 4096, 128).host_link_bytes
        assert estimate.moved_bytes_per_token == reported
    # offloaded_static moves its whole allocation of 4,096 + 127 tokens both ways at every step
    assert reported == 2 * PER_TOKEN * 2 * (4096 + 127)


def test_a_cells_time_counts_every_prefill_and_every_call_its_rules_allow():
    estimate = estimate_offload(cell("offloaded", 65536, 4), get_strategy("offloaded"), SHAPE, 25.0, LONG_CONTEXT)
    per_token = PER_TOKEN * 4  # batch 4
    # The prefill writes all 32 layers of 65,536 tokens to the host and brings the first one back.
    prefill = 65536 * per_token * (32 + 1) / 32
    # 127 decode steps, each bringing every layer in at 65,536 + j - 1 tokens and back at 65,536 + j.
    decode = sum(per_token * ((65536 + j - 1) + (65536 + j)) for j in range(1, 128))
    call_s = (prefill + decode) / LINK  # about 351 s
    # Calls: 1 cold + 2 warmup + 5 repeats (the 2 s floor is met by the first) + 8 re-runs of discarded
    # calls (the 60 s cap stops nothing before the 5 repeats are kept) + 1 quality call = 17.
    calls = 1 + 2 + 5 + 8 + 1
    assert estimate.call_seconds == pytest.approx(call_s, rel=1e-9)
    assert estimate.calls.total == calls
    assert estimate.cell_seconds == pytest.approx(calls * call_s, rel=1e-9)  # about 5,965 s
    # Counting 9 calls of 128 token round trips and no prefill, as before, made it about 3,170 s: it ran.
    assert 9 * 128 * 2 * per_token * (65536 + 64) / LINK == pytest.approx(3170, rel=0.01)
    planned = plan_cell(cell("offloaded", 65536, 4), "cuda", SHAPE, host=HostLimits(2 * TB, 25.0, 3600, LONG_CONTEXT))
    assert not planned.runs and "predicted timeout" in planned.skip_reason and "17 calls" in planned.skip_reason


@pytest.mark.parametrize(
    ("call_s", "changed", "kept", "discarded"),
    [
        (351.0, {}, 5, 8),  # slow calls: the repeats meet the floor, the time cap stops nothing early
        (0.3, {}, 7, 8),  # fast calls: 2 s / 0.3 s = 6.7, so 7 kept calls reach the floor
        (0.01, {}, 30, 8),  # the floor would take 200: max_repeats caps it
        (0.3, {"target_rel_ci": 0.02}, 30, 8),  # a precision target may never be met: up to the cap
        (10.0, {"min_duration_s": 100.0, "max_discarded": 1}, 5, 1),  # 60 s cap: 6 calls, 5 + 1 re-run
        # the schema's "off" values: no time cap, and no contention guard (max_host_contention=1), so
        # none of the 8 re-runs max_discarded allows can happen
        (1.0, {"max_duration_s": 0.0, "max_host_contention": 1.0}, 5, 0),
        (0.3, {"max_host_contention": 1.0}, 7, 0),  # the guard off: only the 2 s floor adds calls
        (1.0, {"max_discarded": 0}, 5, 0),  # the guard on, with no re-runs allowed
    ],
)
def test_the_worst_case_call_count_follows_the_measured_phase_rules(call_s, changed, kept, discarded):
    count = worst_case_calls(protocol(**changed), call_s)
    assert (count.kept, count.discarded) == (kept, discarded)
    assert count.total == 1 + 2 + kept + discarded + 1


@pytest.mark.parametrize(
    ("call_s", "changed"),
    [
        (0.3, {}),
        (1.0, {}),
        (0.01, {"max_discarded": 3}),
        (0.3, {"min_duration_s": 0.0, "repeats": 2}),
        (0.3, {"max_host_contention": 1.0}),  # the guard off: even a host others fill discards nothing
    ],
)
def test_the_count_is_what_the_measured_phase_makes_when_every_call_it_may_discard_is_contended(call_s, changed):
    """A second reading: `measure_phase` run with calls of `call_s` seconds and a host others fill entirely."""
    rules_of = protocol(**changed, max_duration_s=0.0)  # its time cap reads the real clock: off here
    busy = CallContention(other_s=2.0, steal_s=0.0, capacity_s=2.0, cpus=2)

    class Busy:
        def start(self) -> None:
            pass

        def stop(self) -> CallContention:
            return busy

    rules = rules_of.with_measure(target_rel_ci=0.0).measure
    counter = itertools.count()
    phase = measure_phase(
        lambda: next(counter),
        lambda _: TokenTimes(1.0, [1.0], call_s * 1000),
        rules,
        Busy(),
        lambda _seconds: None,
    )
    assert len(phase.kept) + len(phase.discarded) == most_measured(rules_of, call_s)


def test_pinned_host_memory_counts_the_prefill_blocks_the_allocator_keeps():
    # 65,536 tokens x 4 sequences: one layer's keys after the prefill are 65,536 x 4 x 2,048 B = 2**29 exactly.
    assert 65536 * 4 * ONE_TENSOR_PER_TOKEN == 2**29
    # The first decoded token makes them 2**29 + 8,192 B: a block of 2**30; the 2**29 blocks stay cached.
    # Every one of the 32 layers passes through the host, keys and values: 64 x (2**29 + 2**30) bytes.
    dynamic = estimate_offload(cell("offloaded", 65536, 4), get_strategy("offloaded"), SHAPE, 25.0, LONG_CONTEXT)
    assert dynamic.host_bytes == 64 * (2**29 + 2**30) == 103_079_215_104  # about 100 GB
    # Counting only the final length's blocks of the 30 layers off the device gave 64.4 GB: 1.5x per
    # tensor for the prefill's blocks, 32 / 30 for the two layers on the device at any one time.
    final_length_only = 2 * 30 * 2**30
    assert dynamic.host_bytes / final_length_only == pytest.approx(1.5 * 32 / 30, rel=1e-9)
    # A static layout is allocated whole before the prefill: 65,663 reserved tokens, one size, 2**30.
    static = estimate_offload(
        cell("offloaded_static", 65536, 4), get_strategy("offloaded_static"), SHAPE, 25.0, LONG_CONTEXT
    )
    assert 2**29 < (65536 + 127) * 4 * ONE_TENSOR_PER_TOKEN <= 2**30
    assert static.host_bytes == 64 * 2**30


def test_pinned_blocks_round_up_to_powers_of_two_and_one_size_makes_one_block():
    # 130,944 to 131,071 tokens x 4: one layer's keys stay just under 2**30 from the prefill to the end.
    assert 131071 * 4 * ONE_TENSOR_PER_TOKEN < 2**30
    under = estimate_offload(cell("offloaded", 130944, 4), get_strategy("offloaded"), SHAPE, 25.0, LONG_CONTEXT)
    assert under.host_bytes == 64 * 2**30
    # 2**18 + 2 - 128 prompt tokens x 4: just under 2**31 after the prefill, just over it at the end.
    context = 2**18 + 2 - 128
    assert context * 4 * ONE_TENSOR_PER_TOKEN < 2**31 < (2**18 + 1) * 4 * ONE_TENSOR_PER_TOKEN
    over = estimate_offload(cell("offloaded", context, 4), get_strategy("offloaded"), SHAPE, 25.0, LONG_CONTEXT)
    assert over.host_bytes == 64 * (2**31 + 2**32)


def test_offloaded_cells_that_cannot_finish_or_fit_are_skipped_with_the_reason():
    roomy = HostLimits(memory_bytes=2 * TB, link_gbps=25.0, timeout_s=3600, protocol=LONG_CONTEXT)
    longest = plan_cell(cell("offloaded", 130944, 4), "cuda", SHAPE, host=roomy)
    assert not longest.runs and "predicted timeout" in longest.skip_reason and "137.4 GB" in longest.skip_reason
    assert plan_cell(cell("offloaded", 4096, 1), "cuda", SHAPE, host=roomy).runs  # 1 GB per token: seconds
    small_host = HostLimits(memory_bytes=32 * 10**9, link_gbps=25.0, timeout_s=10**9, protocol=LONG_CONTEXT)
    fat = plan_cell(cell("offloaded_static", 65536, 4), "cuda", SHAPE, host=small_host)
    assert not fat.runs and "predicted host oom" in fat.skip_reason and "68.7 GB" in fat.skip_reason
    assert plan_cell(cell("dynamic", 130944, 4), "cuda", SHAPE, host=small_host).offload is None


def test_the_long_context_sweep_plans_only_offloaded_cells_that_can_finish():
    from kvsweep.config.compose import compose_config
    from kvsweep.plan.sweep_plan import plan_sweep

    # an H200's memory, so no device-memory prediction depends on this machine's GPU
    overrides = ["+sweep=long_context", "grid.models=[llama-3.1-8b]", "planner.host_memory_gb=2000"]
    overrides.append("planner.device_memory_gb=141")
    planned, _ = plan_sweep(compose_config(overrides).config, "cuda")
    offloaded = {(p.cell.cache, p.cell.context_length, p.cell.batch_size): p for p in planned if p.offload}
    # By hand: 17 calls (above) of 127 round trips of the cache and one prefill each, at 25 GB/s, within
    # 3600 s: one call may take 3600 / 17 = 211.8 s. The 127 round trips move batch x (2 context + 127)
    # tokens each on average (in at context + j - 1, back at context + j), 131,072 B per token: batch 4
    # at 32,768 is 175 s per call (runs), at 65,536 it is 351 s (skipped, as is 130,944); batch 1 at
    # 130,944 is 175 s (runs).
    per_call_limit = 3600 / 17
    for key, p in offloaded.items():
        _, context, batch = key
        by_hand = (127 * PER_TOKEN * batch * (2 * context + 127) + PER_TOKEN * batch * context * 33 / 32) / LINK
        assert p.runs == (by_hand <= per_call_limit), key
    too_slow = {(cache, context, 4) for cache in ("offloaded", "offloaded_static") for context in (65536, 130944)}
    assert len(offloaded) == 2 * 6 * 2  # two offloaded caches x six contexts x two batch sizes
    assert {key for key, p in offloaded.items() if not p.runs} == too_slow
    for reason in (offloaded[key].skip_reason for key in too_slow):
        assert "predicted timeout" in reason and "ray.cell_timeout_s=3600" in reason
    assert math.isclose(per_call_limit, 211.76, rel_tol=1e-3)


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
