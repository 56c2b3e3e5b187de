"""Sliding-window, chunked and hybrid layers counted byte for byte (issue 25, item 2).

Transformers' caches keep per-layer kinds: a sliding-window or chunked layer keeps only its window, a
state layer a fixed state. That the planner's bytes equal the real cache's on models of every kind, with
contexts past the window, and that quantized caches refuse them, is the table in
`test_planned_equals_measured.py`; the hand computations here restate how Transformers' layers hold
tokens, independently of kvsweep's accounting.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kvsweep.caches import get_strategy
from kvsweep.grid import Cell
from kvsweep.measure.cache_identity import cache_bytes
from kvsweep.models.build import build_model
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import classify, kv_shape, load_config
from kvsweep.models.shape import KvShape, shape_from_dict
from kvsweep.plan.cell_plan import plan_cell
from kvsweep.plan.kv_prediction import cell_dense_kv_bytes, decode_kv_traffic
from kvsweep.plan.memory_fit import estimate_peak
from kvsweep.plan.offload import pinned_host_bytes, prefill_bytes
from kvsweep.plan.sweep_plan import predicted_metrics
from kvsweep_testkit.layer_kinds import TINY_LAYER_KINDS, WINDOW, tiny_preset_config

# One token of one layer's K and V: 2 x 2 KV heads x head_dim 8 x 4 bytes (float32, batch 1)
LAYER_TOKEN = 2 * 2 * 8 * 4


@pytest.fixture(scope="module")
def folders(layer_kind_folders) -> dict[str, Path]:
    return layer_kind_folders  # saved once for the session (tests/conftest.py)


def expected_windows(name: str) -> tuple[int | None, ...]:
    """Each tiny model's layers as its config says: a window of 16 tokens, or every token (None), or no K/V (0)."""
    return {
        "tiny-mistral-sliding": (WINDOW,) * 4,
        "tiny-gemma3-alternating": (WINDOW, None) * 2,
        "tiny-gpt-oss-alternating": (WINDOW, None) * 2,
        "tiny-llama4-chunked": (WINDOW, None) * 2,
        "tiny-lfm2-hybrid": (0, None) * 2,
    }[name]


@pytest.mark.parametrize("name", sorted(TINY_LAYER_KINDS))
def test_both_shape_readers_describe_the_layers_transformers_builds(folders, name):
    """The torch-free reader (a folder's config.json) and Transformers' config agree, layer by layer; a config
    whose class derives its layer types itself (Mistral's window) is left to Transformers, not guessed."""
    config = load_config(classify(str(folders[name])))
    from_transformers = kv_shape(config)
    assert from_transformers.layer_windows == expected_windows(name)
    plain = shape_from_dict(json.loads((folders[name] / "config.json").read_text()))
    assert plain == (None if name == "tiny-mistral-sliding" else from_transformers)
    assert read_facts(classify(str(folders[name]))).shape == from_transformers
    if name == "tiny-lfm2-hybrid":  # a short convolution keeps hidden 32 x conv_L_cache 3 per batch row
        assert from_transformers.state_elements == (32 * 3, 0) * 2


def _run(measured_cell, folder: Path, cache: str) -> dict:
    """Context 30, 8 new tokens, batch 1, float32: a row of the planned = measured table, measured once."""
    return measured_cell(Cell(str(folder), "float32", 30, 1, 8, cache, False))


def test_what_sliding_layers_hold_by_hand(folders, measured_cell):
    """Context 30, 8 new tokens (37 cached), window 16. A dynamic sliding layer keeps a view of its last 15
    tokens on the storage of the last concatenation (15 + the new token = 16); a static one allocates 16."""
    for name, full_layers in (("tiny-mistral-sliding", 0), ("tiny-gemma3-alternating", 2)):
        sliding = 4 - full_layers
        for cache, full_tokens in (("dynamic", 37), ("static", 37), ("static@40", 40)):
            result = _run(measured_cell, folders[name], cache)
            expected = LAYER_TOKEN * (sliding * WINDOW + full_layers * full_tokens)
            assert result["metrics"]["kv_cache_bytes"] == expected, (name, cache)
        # the dense yardstick keeps the same per-layer rule: 2 x 16 + 2 x 37 tokens = 13,568 bytes for gemma3
        assert result["metrics"]["kv_cache_bytes_dense"] == LAYER_TOKEN * (sliding * WINDOW + full_layers * 37)
    assert LAYER_TOKEN * (2 * WINDOW + 2 * 37) == 13_568


def test_a_decode_step_reads_each_layers_window_not_every_token(folders):
    """Dynamic, context 14, 6 new tokens, window 16: step j attends over min(14 + j, 16) tokens on a sliding
    layer (15, then 16) and 14 + j on a full one; gemma3 alternates them (2 and 2)."""
    shape = kv_shape(load_config(classify(str(folders["tiny-gemma3-alternating"]))))
    steps = [2 * min(14 + j, WINDOW) + 2 * (14 + j) for j in range(1, 6)]
    assert steps == [2 * 15 + 2 * 15, 2 * 16 + 2 * 16, 2 * 16 + 2 * 17, 2 * 16 + 2 * 18, 2 * 16 + 2 * 19]
    got = decode_kv_traffic(get_strategy("dynamic"), shape, 1, "float32", prompt=14, new=6)
    assert got.device_bytes == pytest.approx(LAYER_TOKEN * sum(steps) / 5)
    every_token = decode_kv_traffic(get_strategy("dynamic"), _all_full(shape), 1, "float32", 14, 6)
    assert got.device_bytes < every_token.device_bytes


def _all_full(shape: KvShape) -> KvShape:
    return KvShape(shape.layers, shape.kv_heads, shape.head_dim, shape.max_positions)


def test_a_model_of_full_attention_layers_only_is_counted_as_before():
    """2 (K, V) x 3 layers x 2 heads x 4 x batch 2 x 4 bytes = 384 bytes a cached token, as before layer kinds;
    an explicit description of full layers counts the same as none, for every strategy and its traffic."""
    plain = KvShape(layers=3, kv_heads=2, head_dim=4, max_positions=None)
    explicit = KvShape(layers=3, kv_heads=2, head_dim=4, max_positions=None, layer_windows=(None,) * 3)
    by_hand = {"dynamic": lambda d: 5 + d, "offloaded": lambda d: 5 + d, "static@16": lambda d: 16}
    for cache in ("dynamic", "static@16", "offloaded", "offloaded_static", "quantized-hqq-int4"):
        strategy = get_strategy(cache)
        for decoded in (0, 3):
            held = strategy.held_bytes(plain, 2, "float32", 5, decoded)
            assert held == strategy.held_bytes(explicit, 2, "float32", 5, decoded), (cache, decoded)
            if cache in by_hand:
                assert held == 384 * by_hand[cache](decoded), (cache, decoded)
        traffic = decode_kv_traffic(strategy, plain, 2, "float32", 5, 4)
        assert traffic == decode_kv_traffic(strategy, explicit, 2, "float32", 5, 4), cache


# 4 layers alternating sliding (window 16) and full, 2 KV heads of 8; batch 1, float32: 128 bytes a layer-token
ALTERNATING = KvShape(layers=4, kv_heads=2, head_dim=8, max_positions=None, layer_windows=(WINDOW, None) * 2)


def test_an_offloaded_static_cache_keeps_its_sliding_layers_on_the_device():
    """Transformers' StaticCache offloads only non-sliding layers (`offload_only_non_sliding=True`): context 30,
    8 new tokens, 37 reserved: the 2 sliding layers (16 tokens) stay, the 2 full ones (37) go to the host and
    back each step, 2 of them on the device at a time."""
    strategy = get_strategy("offloaded_static")
    cell = Cell("tiny", "float32", 30, 1, 8, "offloaded_static", False)
    assert strategy.held_bytes(ALTERNATING, 1, "float32", 30, 7) == LAYER_TOKEN * (2 * 16 + 2 * 37)
    traffic = decode_kv_traffic(strategy, ALTERNATING, 1, "float32", prompt=30, new=8)
    assert traffic.host_link_bytes == pytest.approx(2 * LAYER_TOKEN * 2 * 37)  # both full layers, both ways
    device = estimate_peak(cell, strategy, ALTERNATING, parameters=0).kv_device_bytes
    assert device == LAYER_TOKEN * (2 * 16 + 2 * 37)  # the sliding layers and the two full ones in flight
    assert prefill_bytes(cell, strategy, ALTERNATING) == LAYER_TOKEN * (2 * 37 + 37)  # first full layer back
    # pinned host blocks: each full layer's K and V of 37 x 64 bytes, rounded up to 4,096
    assert pinned_host_bytes(cell, strategy, ALTERNATING) == 2 * 2 * 4096


def test_an_offloaded_dynamic_cache_moves_its_sliding_layers_as_their_kept_view():
    """Transformers' DynamicCache offloads every layer (`offload_only_non_sliding=False`); a sliding layer goes
    to the host as its view of the last 15 tokens and comes back as that copy. Context 30, 3 new tokens: each
    step moves 15 + 15 tokens per sliding layer and (30 + j - 1) + (30 + j) per full one, and attention reads
    16 and 30 + j on the device."""
    strategy = get_strategy("offloaded")
    assert strategy.held_bytes(ALTERNATING, 1, "float32", 30, 2) == LAYER_TOKEN * (2 * 15 + 2 * 32)
    traffic = decode_kv_traffic(strategy, ALTERNATING, 1, "float32", prompt=30, new=3)
    link = [2 * (15 + 15) + 2 * ((30 + j - 1) + (30 + j)) for j in (1, 2)]
    assert traffic.host_link_bytes == pytest.approx(LAYER_TOKEN * sum(link) / 2)
    attended = [2 * 16 + 2 * (30 + j) for j in (1, 2)]
    assert traffic.device_bytes == pytest.approx(LAYER_TOKEN * sum(attended) / 2)


@pytest.mark.parametrize(
    "cache, peak_tokens, returned_tokens",
    [
        # resident sliding layers (2 x 16), and of the full layers (32 reserved) two at a step's peak, one after
        ("offloaded_static", 2 * 16 + 2 * 32, 2 * 16 + 32),
        # every layer moves; the largest two (full, 32 tokens) at the peak, layer 0 (sliding, its 15-token view) after
        ("offloaded", 2 * 32, 15),
    ],
)
def test_an_offloaded_cache_is_predicted_on_the_device_at_the_moment_it_is_read(cache, peak_tokens, returned_tokens):
    """`kv_cache_device_bytes` is read when `generate` returns. Each layer's update first prefetches the next moved
    layer, circling back to the first, then offloads itself: after the last layer's update of the last step the
    first moved layer is on the device and every other moved layer on the host. The planner fits the GPU with the
    peak of a step (two moved layers in flight); `predicted_kv_device_bytes` is the moment it is compared with."""
    cell = Cell("tiny", "float32", 30, 1, 3, cache, False)
    strategy = get_strategy(cache)
    assert estimate_peak(cell, strategy, ALTERNATING, parameters=0).kv_device_bytes == LAYER_TOKEN * peak_tokens
    planned = plan_cell(cell, "cuda", ALTERNATING)
    assert planned.kv_device_bytes == LAYER_TOKEN * returned_tokens
    assert predicted_metrics(planned)["predicted_kv_device_bytes"] == LAYER_TOKEN * returned_tokens


@pytest.mark.parametrize("implementation, cache", [("dynamic", "dynamic"), ("static", "static")])
def test_a_hybrids_state_layers_hold_a_fixed_state_and_no_keys(folders, measured_cell, implementation, cache):
    """LFM2: 2 conv layers keep hidden 32 x 3 positions (384 bytes each, float32), the 2 full layers every token;
    as a cell, the state layers are the model's and the attention layers the strategy's."""
    folder = folders["tiny-lfm2-hybrid"]
    model = build_model(classify(str(folder)), "float32", "cpu", seed=0)
    prompt = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = model.generate(
            prompt, max_new_tokens=8, do_sample=False, cache_implementation=implementation, return_dict_in_generate=True
        )
    measured = cache_bytes(out.past_key_values).total
    shape = read_facts(classify(str(folder))).shape
    assert (
        measured == get_strategy(cache).held_bytes(shape, 1, "float32", 30, 7) == 2 * 32 * 3 * 4 + LAYER_TOKEN * 2 * 37
    )
    cell = Cell(str(folder), "float32", 30, 1, 8, cache, False)
    assert cell_dense_kv_bytes(cell, shape) == measured
    result = _run(measured_cell, folder, cache)
    assert result["status"] == "ok", result["error"]
    assert result["metrics"]["kv_cache_bytes"] == measured
    assert "LinearAttentionLayer" in result["tags"]["kvsweep.cache_class"]


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma-3-12b", "qwen3-8b"])
def test_a_new_presets_family_runs_at_a_tiny_scale_and_is_counted_exactly(name):
    """Each new preset's family and layer pattern, shrunk: it builds, generates past the window, and the planner's
    bytes (from either shape reader) equal its real dynamic and static caches."""
    model_type, config = tiny_preset_config(name)
    hf_config = AutoConfig.for_model(model_type, **config)
    shape = kv_shape(hf_config)
    assert shape_from_dict(dict(config, model_type=model_type)) == shape
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config).eval()
    model.generation_config.eos_token_id = None
    prompt = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(0))
    for cache in ("dynamic", "static"):
        with torch.inference_mode():
            out = model.generate(
                prompt, max_new_tokens=6, do_sample=False, cache_implementation=cache, return_dict_in_generate=True
            )
        assert cache_bytes(out.past_key_values).total == get_strategy(cache).held_bytes(shape, 1, "float32", 30, 5)
