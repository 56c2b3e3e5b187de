"""Caches Transformers refuses for a model's layer types are planned as skipped, saying which (issue 42, part 7).

Transformers' `QuantizedCache` (quanto, HQQ, fp8) takes only `full_attention` layers, its continuous batching
(`paged`) only `full_attention` and `sliding_attention`. kvsweep counts a "hybrid" layer (Falcon-H1, Zamba) or a
type it does not know as full attention, so the planner judges by the types themselves (`KvShape.layer_types`).
Each expectation here is checked against Transformers itself: building its cache for the same config raises.
Tiny configs only, built in memory (no Hub, no weights).
"""

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig, PretrainedConfig
from transformers.cache_utils import QuantizedCache, get_layer_types_and_kwargs
from transformers.generation.continuous_batching.cache import ATTN_TYPE_TO_ALLOCATOR, group_layers_by_attn_type

from kvsweep.caches import get_strategy
from kvsweep.caches.layer_tokens import PAGED_LAYER_TYPES, quantizable
from kvsweep.caches.native_build import Toolchain
from kvsweep.caches.registry import cache_names
from kvsweep.grid import Cell
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import classify, kv_shape
from kvsweep.models.shape import DERIVING_MODEL_TYPES, KvShape, shape_from_dict
from kvsweep.plan.cell_plan import PlannedCell, plan_cell

_ATTENTION: dict[str, Any] = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
)
# name -> (model type, config, the layers Transformers' caches refuse, as the reason names them)
MODELS: dict[str, tuple[str, dict[str, Any], str]] = {
    # every layer "hybrid": attention beside a Mamba-2 state, counted by kvsweep as full attention
    "falcon-h1-like": (
        "falcon_h1",
        dict(
            _ATTENTION,
            num_hidden_layers=2,
            head_dim=8,
            mamba_d_ssm=32,
            mamba_n_heads=4,
            mamba_d_head=8,
            mamba_d_state=8,
            mamba_n_groups=1,
        ),
        "hybrid (2 layers)",
    ),
    # Mamba layers ("linear_attention") and one shared-attention "hybrid" layer
    "zamba-like": (
        "zamba",
        dict(
            _ATTENTION,
            num_key_value_heads=4,
            num_hidden_layers=4,
            attn_layer_period=2,
            attn_layer_offset=1,
            mamba_d_state=8,
            mamba_dt_rank=4,
            n_mamba_heads=1,
        ),
        "linear_attention (3 layers), hybrid (1 layer)",
    ),
    # a type Transformers allows and kvsweep's shape reader does not know (counted as full attention)
    "unknown-type": (
        "llama",
        dict(_ATTENTION, num_hidden_layers=3, layer_types=["full_attention", "indexed_attention", "full_attention"]),
        "indexed_attention (1 layer)",
    ),
}
LLAMA = ("llama", dict(_ATTENTION, num_hidden_layers=2))  # the control: full attention only
QUANTIZED = [name for name in cache_names() if get_strategy(name).backend is not None]
BACKENDS = sorted({get_strategy(name).backend for name in QUANTIZED})
TOOLS = Toolchain(cuda_home=None, ninja=True, compiler=True)  # quanto's CPU extension could be built here


def _config(model_type: str, settings: dict[str, Any]) -> PretrainedConfig:
    return AutoConfig.for_model(model_type, **settings)


def _plan(shape: KvShape, cache: str) -> PlannedCell:
    """A small CPU cell, every package taken as installed: only the model's layers can refuse it."""
    cell = Cell("tiny", "float32", 64, 1, 8, cache, False)
    return plan_cell(cell, "cpu", shape, lambda module: True, toolchain=TOOLS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_shape_keeps_the_layer_types_transformers_builds_caches_from(name):
    model_type, settings, _ = MODELS[name]
    config = _config(model_type, settings)
    assert kv_shape(config).layer_types == tuple(get_layer_types_and_kwargs(config)[0])
    assert kv_shape(_config(*LLAMA)).layer_types == ()  # all full attention: () as `layer_windows`


@pytest.mark.parametrize("cache", QUANTIZED)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_quantized_cache_is_planned_skipped_naming_the_layers(name, cache):
    model_type, settings, refused = MODELS[name]
    planned = _plan(kv_shape(_config(model_type, settings)), cache)
    assert not planned.runs
    assert planned.skip_reason == (
        f"{cache}: Transformers' QuantizedCache holds only full-attention layers (full_attention); "
        f"this model has {refused}"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_quantized_cache_refuses_the_same_models(name, backend):
    """The rule is Transformers': its `QuantizedCache` raises for each of these models, whatever the backend."""
    model_type, settings, _ = MODELS[name]
    config = _config(model_type, settings)
    assert not quantizable(kv_shape(config))
    with pytest.raises(ValueError, match="only full attention layers"):
        QuantizedCache(backend, config)


def test_paged_is_planned_skipped_naming_the_layers_continuous_batching_refuses():
    for name, (model_type, settings, refused) in MODELS.items():
        planned = _plan(kv_shape(_config(model_type, settings)), "paged")
        assert not planned.runs, name
        assert planned.skip_reason == (
            "paged: Transformers' continuous batching accepts only full_attention and sliding_attention layers, "
            f"and kvsweep sizes a page pool for full-attention layers only; this model has {refused}"
        )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_continuous_batching_refuses_the_same_models(name):
    """`PagedAttentionCache` groups the layers by type first (`group_layers_by_attn_type`), and raises there."""
    model_type, settings, _ = MODELS[name]
    with pytest.raises(ValueError, match="Invalid layer type"):
        group_layers_by_attn_type(_config(model_type, settings).get_text_config())


def test_the_paged_rule_is_the_allocators_transformers_has():
    assert frozenset(ATTN_TYPE_TO_ALLOCATOR) == PAGED_LAYER_TYPES


def test_sliding_layers_continuous_batching_takes_are_skipped_as_kvsweeps_own_limit():
    """Transformers runs a sliding model under continuous batching; kvsweep's pool accounting does not yet."""
    config = _config("mistral", dict(_ATTENTION, num_hidden_layers=2, sliding_window=16))
    assert set(group_layers_by_attn_type(config.get_text_config())) == {"sliding_attention"}
    assert _plan(kv_shape(config), "paged").skip_reason == (
        "paged: kvsweep sizes a page pool for full-attention layers only; this model has sliding_attention (2 layers)"
    )


@pytest.mark.parametrize("cache", ["dynamic", "paged", *QUANTIZED])
def test_a_full_attention_model_stays_planned_to_run(cache):
    config = _config(*LLAMA)
    assert _plan(kv_shape(config), cache).runs
    if cache == "quantized-fp8":  # and Transformers builds its cache (fp8 needs no package)
        QuantizedCache("fp8", config)
        group_layers_by_attn_type(config.get_text_config())


def test_the_plain_reader_leaves_configs_that_derive_their_types_to_transformers(tmp_path: Path):
    """A saved Falcon-H1 config.json writes no layer types (its class derives "hybrid" for every layer): read
    without Transformers it would look like full attention, and be planned to run quantized."""
    for model_type in DERIVING_MODEL_TYPES:
        written = json.loads(AutoConfig.for_model(model_type).to_json_string())
        assert shape_from_dict(written) is None, model_type
    model_type, settings, refused = MODELS["falcon-h1-like"]
    _config(model_type, settings).save_pretrained(tmp_path)
    shape = read_facts(classify(str(tmp_path))).shape
    assert shape.layer_types == ("hybrid", "hybrid")
    assert refused in (_plan(shape, "quantized-hqq-int4").skip_reason or "")


def test_the_plain_reader_keeps_the_types_as_transformers_names_them():
    """A written "moe" layer is Transformers' "dummy" (no attention) in both readers, and refused by name."""
    config = _config("llama", dict(_ATTENTION, num_hidden_layers=2, layer_types=["full_attention", "moe"]))
    shape = shape_from_dict(json.loads(config.to_json_string()))
    assert shape == kv_shape(config)
    assert shape is not None and shape.layer_types == ("full_attention", "dummy")
    assert (_plan(shape, "quantized-fp8").skip_reason or "").endswith("this model has dummy (1 layer)")
