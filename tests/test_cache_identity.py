"""The cache that ran is the cache that is named: silent fallbacks become errors, never numbers."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

from kvsweep.caches import get_strategy
from kvsweep.grid import MeasureProtocol
from kvsweep.measure.cache_identity import describe_cache, mismatch
from kvsweep.models.presets import PRESETS
from kvsweep_testkit.cells import measure_cell

PROTO = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1).to_dict()
FIXTURES = Path(__file__).parent / "fixtures"


def tiny_config() -> LlamaConfig:
    return LlamaConfig(**PRESETS["tiny-llama"].config)


def cell(cache: str, model: str = "tiny-llama", compile: bool = False) -> dict:
    shape = dict(dtype="float32", context_length=32, batch_size=1, max_new_tokens=4)
    return dict(model=model, **shape, cache=cache, compile=compile)


@pytest.fixture(scope="module")
def cacheless_model(tmp_path_factory) -> str:
    """A local custom-code model folder whose class refuses default caches."""
    folder = tmp_path_factory.mktemp("cacheless")
    config = tiny_config()
    config.auto_map = {"AutoModelForCausalLM": "modeling_cacheless.CachelessLlamaForCausalLM"}
    config.architectures = ["CachelessLlamaForCausalLM"]
    LlamaForCausalLM(config).save_pretrained(folder)
    config.save_pretrained(folder)
    shutil.copy(FIXTURES / "modeling_cacheless.py", folder / "modeling_cacheless.py")
    return str(folder)


def test_a_model_that_ignores_cache_implementation_fails_the_cell(cacheless_model):
    result = measure_cell(cell("static", model=cacheless_model), PROTO, trust_remote_code=True)
    assert result["status"] == "error"
    assert "asked for static" in result["error"] and "DynamicCache/DynamicLayer" in result["error"], result["error"]
    assert "tpot_ms" not in result["metrics"]  # no number under the wrong name
    # the same model asked for what it really does is fine
    dynamic = measure_cell(cell("dynamic", model=cacheless_model), PROTO, trust_remote_code=True)
    assert dynamic["status"] == "ok", dynamic["error"]
    assert dynamic["tags"]["kvsweep.cache_class"] == "DynamicCache/DynamicLayer"


@pytest.mark.slow
def test_compile_asked_but_not_done_fails_the_cell():
    """TORCHDYNAMO_DISABLE=1 makes torch.compile silently run eager; a fresh process, as each cell is."""
    script = (
        "import json; from kvsweep_testkit.cells import measure_cell; "
        f"print(json.dumps(measure_cell({cell('static', compile=True)!r}, {PROTO!r})))"
    )
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "error"
    assert "compiled" in result["error"] and "eagerly" in result["error"], result["error"]


@pytest.mark.slow
def test_a_compiled_cell_records_its_graphs_and_judges_quality_with_them():
    result = measure_cell(cell("static", compile=True), PROTO)
    assert result["status"] == "ok", result["error"]
    assert int(result["environment"]["compiled_graphs"]) >= 1
    assert result["environment"]["quality_forward"] == "compiled"
    assert result["metrics"]["kl_divergence"] < 1e-4  # an exact cache stays exact when compiled
    assert result["metrics"]["compile_recaptures"] == 0  # nothing compiled while it was measured
    # the one cache the cell keeps (reset per call) is the cache generate would have built: 32 + 4 - 1 tokens
    assert result["tags"]["kvsweep.cache_class"] == "StaticCache/StaticLayer max_cache_len=35"
    eager = measure_cell(cell("static"), PROTO)
    assert "compiled_graphs" not in eager["environment"] and eager["environment"]["quality_forward"] == "eager"
    assert "compile_recaptures" not in eager["metrics"]
    assert eager["tags"]["kvsweep.cache_class"] == result["tags"]["kvsweep.cache_class"]


@pytest.mark.slow
def test_compiling_while_measured_fails_the_cell_and_keeps_its_numbers():
    """A fault drops the compiled graphs once per call, so each measured call compiles again."""
    protocol = MeasureProtocol.from_dict(PROTO).with_measure(repeats=2).to_dict()
    result = measure_cell(cell("static", compile=True), protocol, faults=[{"fault": "recompile"}])
    assert result["status"] == "error"
    assert "during the measured calls" in result["error"], result["error"]
    assert result["metrics"]["compile_recaptures"] >= 2  # at least one per measured call
    assert result["metrics"]["tpot_ms"] > 0  # measured, logged, and marked as failed


def test_offloading_and_reserved_length_tell_caches_apart():
    """Real cache objects, built directly: the same classes with other settings are other strategies."""
    config = tiny_config()
    offloaded = describe_cache(DynamicCache(config=config, offloading=True))
    assert offloaded.tag == "DynamicCache/DynamicLayer offloading=true"
    assert mismatch(get_strategy("offloaded"), offloaded, cached_tokens=100) is None
    assert "offloading" in mismatch(get_strategy("dynamic"), offloaded, cached_tokens=100)

    static = describe_cache(StaticCache(config=config, max_cache_len=100))
    assert static.tag == "StaticCache/StaticLayer max_cache_len=100"
    assert mismatch(get_strategy("static"), static, cached_tokens=100) is None
    assert "reserved length" in mismatch(get_strategy("static@200"), static, cached_tokens=100)
    assert "asked for static@200 (StaticCache/StaticLayer max_cache_len=200)" in mismatch(
        get_strategy("static@200"), static, cached_tokens=100
    )
    assert mismatch(get_strategy("no_cache"), describe_cache(None), cached_tokens=100) is None
    assert "a cache object" in mismatch(get_strategy("no_cache"), static, cached_tokens=100)
    assert "cache class" in mismatch(get_strategy("quantized-hqq-int4"), static, cached_tokens=100)


def test_a_sliding_window_model_static_cache_is_still_static():
    """Every layer sliding: each reserves only its window, which must not read as a wrong length."""
    from transformers import MistralConfig

    config = MistralConfig(**{**PRESETS["tiny-llama"].config, "sliding_window": 16})
    sliding = describe_cache(StaticCache(config=config, max_cache_len=100))
    assert all("StaticSlidingWindowLayer" in layer for layer in sliding.layer_classes)
    assert mismatch(get_strategy("static"), sliding, cached_tokens=100) is None
    assert "cache class" in mismatch(get_strategy("dynamic"), sliding, cached_tokens=100)
