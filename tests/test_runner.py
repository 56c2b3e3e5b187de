"""Every cache strategy that can run on CPU, measured by the real runner with real generation.

KV bytes are checked against the formula (2 x layers x kv_heads x head_dim x tokens x batch x
bytes), quantized payloads against their packed layout, timings against their own definitions.
"""

import pytest

from kvsweep.caches import cache_names, get_strategy
from kvsweep.grid import MeasureProtocol
from kvsweep.models.resolve import classify, kv_shape, load_config
from kvsweep_testkit.cells import measure_cell

PROTO = MeasureProtocol.exact(warmup=1, repeats=3, seed=0, device="cpu", threads=1).to_dict()
SHAPE = kv_shape(load_config(classify("tiny-llama")))
CONTEXT, NEW = 256, 8  # every CPU strategy once: a short cell keeps the fast tier fast


def cell(cache, context=CONTEXT, batch=2, new=NEW, dtype="float32", compile=False):
    return {
        "model": "tiny-llama",
        "dtype": dtype,
        "context_length": context,
        "batch_size": batch,
        "max_new_tokens": new,
        "cache": cache,
        "compile": compile,
    }


def dense(tokens, batch, dtype_bytes):
    return 2 * SHAPE.layers * SHAPE.kv_heads * SHAPE.head_dim * tokens * batch * dtype_bytes


@pytest.fixture(scope="module")
def results():
    names = [n for n in cache_names() if not get_strategy(n).requires.cuda] + ["static@2048"]
    return {name: measure_cell(cell(name), PROTO) for name in names}


def test_cpu_strategies_all_run(results):
    for name, result in results.items():
        assert result["status"] == "ok", (name, result["error"])
        assert result["metrics"]["repeats"] == 3
        assert len(result["samples"]["repeats"]) == 3
        assert result["environment"]["torch_threads"] == 1
        # A CPU cell's evidence is the host's CPUs (no GPU to ask); with no limit set, none is exceeded.
        assert result["tags"]["kvsweep.contended"] == "false"
        assert result["tags"]["kvsweep.contention"].startswith("host ")


def test_dynamic_kv_bytes_equal_the_formula(results):
    tokens = CONTEXT + NEW - 1
    m = results["dynamic"]["metrics"]
    assert m["kv_cache_bytes"] == dense(tokens, 2, 4) == m["kv_cache_bytes_dense"]


def test_static_is_sized_to_what_it_was_asked_to_hold(results):
    assert results["static"]["metrics"]["kv_cache_bytes"] == dense(CONTEXT + NEW - 1, 2, 4)
    assert results["static@2048"]["metrics"]["kv_cache_bytes"] == dense(2048, 2, 4)


def test_quantized_stores_packed_codes(results):
    d = dense(CONTEXT + NEW - 1, 2, 4)
    for name in ("quantized-hqq-int4", "quantized-quanto-int4", "quantized-hqq-int2", "quantized-quanto-int2"):
        stored = results[name]["metrics"]["kv_cache_bytes"]
        assert stored < 0.35 * d, name
        assert stored == get_strategy(name).held_bytes(SHAPE, 2, "float32", prompt=CONTEXT, decoded=NEW - 1), name
    assert results["quantized-hqq-int8"]["metrics"]["kv_cache_bytes"] < 0.5 * d


def test_no_cache_holds_nothing_and_is_slow_per_token(results):
    assert results["no_cache"]["metrics"]["kv_cache_bytes"] == 0
    assert results["no_cache"]["metrics"]["tpot_ms"] > 2 * results["dynamic"]["metrics"]["tpot_ms"]


def test_timings_are_consistent(results):
    for name, result in results.items():
        m, samples = result["metrics"], result["samples"]["repeats"]
        for s in samples:
            assert len(s["gaps_ms"]) == NEW - 1
            assert s["ttft_ms"] > 0 and all(g > 0 for g in s["gaps_ms"])
            assert s["e2e_ms"] >= s["ttft_ms"] + sum(s["gaps_ms"])
        per_run_rate = sorted(2 * (NEW - 1) / (sum(s["gaps_ms"]) / 1e3) for s in samples)
        assert m["decode_tokens_per_s"] == pytest.approx(per_run_rate[1]), name
        assert m["ttft_ms"] == pytest.approx(sorted(s["ttft_ms"] for s in samples)[1]), name
        assert m["prefill_tokens_per_s"] == pytest.approx(2 * CONTEXT / (m["ttft_ms"] / 1e3), rel=0.01)
        assert m["tpot_ms_p90"] >= min(g for s in samples for g in s["gaps_ms"])
        assert m["first_call_ms"] > 0 and m["peak_host_rss_bytes"] > 0


def test_exact_strategies_agree_with_dynamic(results):
    for name in ("dynamic", "static", "static@2048", "no_cache"):
        assert results[name]["metrics"]["token_agreement"] == pytest.approx(1.0, abs=0.1), name


def test_oom_inside_generate_is_classified():
    result = measure_cell(
        cell("static", context=64, new=4), PROTO, faults=[{"match": {"cache": "static"}, "fault": "oom"}]
    )
    assert result["status"] == "oom"
    assert "out of memory" in result["error"].lower()


def test_error_inside_generate_is_an_error_with_traceback():
    result = measure_cell(cell("dynamic", context=64, new=4), PROTO, faults=[{"match": {}, "fault": "error"}])
    assert result["status"] == "error" and "ValueError: injected error" in result["error"]
    assert "Traceback" in result["traceback"]


def test_offloaded_on_cpu_is_skipped_not_crashed():
    result = measure_cell(cell("offloaded", context=64, new=4), PROTO)
    assert result["status"] == "skipped" and "CUDA" in result["error"]


def test_unknown_model_is_an_error():
    result = measure_cell({**cell("dynamic", context=64, new=4), "model": "/no/such/model"}, PROTO)
    assert result["status"] == "error"


@pytest.mark.slow
def test_compile_cost_lands_in_first_call_not_in_the_medians():
    compiled = measure_cell(cell("static", context=64, batch=1, new=8, compile=True), PROTO)
    assert compiled["status"] == "ok", compiled["error"]
    m = compiled["metrics"]
    assert m["first_call_ms"] > 10 * m["e2e_ms"]  # compilation happened in the cold call only
    assert m["token_agreement"] == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize(
    ("cache", "compiled"),
    [
        ("static", False),
        ("static", True),
        ("offloaded_static", True),
        ("offloaded", False),
        ("quantized-hqq-int4", False),
    ],
)
def test_cuda_generation_config_compiles_only_when_asked(cache, compiled):
    """On CUDA generate would compile static caches by itself: compile=false must switch that off."""
    import torch

    from kvsweep.cell.generate_session import GenerateSession
    from kvsweep.grid import Cell

    session = GenerateSession(
        None, torch.zeros(1, 4, dtype=torch.long), Cell(**cell(cache, compile=compiled)), "cuda", fault=None
    )
    config = session.generation_config(get_strategy(cache))
    assert config.disable_compile is (not compiled)
    assert (config.compile_config is not None) is compiled
    assert config.cache_implementation == get_strategy(cache).implementation
    assert config.max_new_tokens == NEW and config.eos_token_id is None and config.do_sample is False
    assert session.clock.sync == session.device_memory.synchronize  # timestamps synchronize the device


def test_quality_is_measured_against_the_dynamic_baseline(results):
    """Exact caches move the distributions only by float noise; quantized ones more, the fewer bits the more."""
    kl = {name: r["metrics"].get("kl_divergence") for name, r in results.items()}
    assert kl["dynamic"] is None  # the baseline itself: nothing to compare
    for exact in ("static", "static@2048", "no_cache"):
        assert kl[exact] < 1e-6, exact
        assert results[exact]["metrics"]["first_divergence"] == NEW, exact
    for name in ("quantized-hqq-int2", "quantized-hqq-int4", "quantized-quanto-int2", "quantized-quanto-int4"):
        assert kl[name] > 1e-6, name
        assert results[name]["metrics"]["kl_divergence_max"] >= kl[name]
    assert kl["quantized-hqq-int2"] > kl["quantized-hqq-int4"] > kl["quantized-hqq-int8"]
    assert kl["quantized-quanto-int2"] > kl["quantized-quanto-int4"]


def test_fast_cells_are_measured_for_at_least_the_minimum_duration():
    floor = MeasureProtocol.from_dict(PROTO).with_measure(repeats=2, min_duration_s=1.0, max_repeats=200)
    result = measure_cell(cell("dynamic", context=64, batch=1, new=4), floor.to_dict())
    repeats = result["samples"]["repeats"]
    assert result["metrics"]["repeats"] == len(repeats) > 2
    assert sum(r["e2e_ms"] for r in repeats) >= 0.8 * 1000  # the gaps between runs are not counted
    capped = measure_cell(
        cell("dynamic", context=64, batch=1, new=4), floor.with_measure(min_duration_s=100.0, max_repeats=3).to_dict()
    )
    assert capped["metrics"]["repeats"] == 3  # the cap wins over the time floor


def test_a_quality_check_that_runs_out_of_memory_keeps_the_measurement():
    """The dynamic baseline may not fit where a lean cache does: the numbers stay, quality says why."""
    oom = [{"match": {"cache": "static"}, "fault": "oom", "during": "quality"}]
    result = measure_cell(cell("static", context=64, batch=1, new=4), PROTO, oom)
    assert result["status"] == "ok" and result["metrics"]["tpot_ms"] > 0
    assert "token_agreement" not in result["metrics"] and "kl_divergence" not in result["metrics"]
    assert result["tags"]["kvsweep.quality"].startswith("not measured: the quality check ran out of memory")
    broken = [{"match": {"cache": "static"}, "fault": "error", "during": "quality"}]
    assert (
        measure_cell(cell("static", context=64, batch=1, new=4), PROTO, broken)["status"] == "error"
    )  # bugs still show


def test_every_cell_names_the_cache_generate_really_used(results):
    """What transformers builds for each strategy, written out by hand (context + new - 1 cached)."""
    expected = {
        "dynamic": "DynamicCache/DynamicLayer",
        "static": f"StaticCache/StaticLayer max_cache_len={CONTEXT + NEW - 1}",
        "static@2048": "StaticCache/StaticLayer max_cache_len=2048",
        "quantized-quanto-int2": "QuantizedCache/QuantoQuantizedLayer nbits=2",
        "quantized-quanto-int4": "QuantizedCache/QuantoQuantizedLayer nbits=4",
        "quantized-hqq-int1": "QuantizedCache/HQQQuantizedLayer nbits=1",
        "quantized-hqq-int2": "QuantizedCache/HQQQuantizedLayer nbits=2",
        "quantized-hqq-int3": "QuantizedCache/HQQQuantizedLayer nbits=3",
        "quantized-hqq-int4": "QuantizedCache/HQQQuantizedLayer nbits=4",
        "quantized-hqq-int8": "QuantizedCache/HQQQuantizedLayer nbits=8",
        "quantized-fp8": "QuantizedCache/Fp8QuantizedLayer",  # its layer class is its format: no nbits
        "paged": "PagedAttentionCache/FullAttentionCacheAllocator",
        "no_cache": "none",
    }
    assert {name: r["tags"]["kvsweep.cache_class"] for name, r in results.items()} == expected
