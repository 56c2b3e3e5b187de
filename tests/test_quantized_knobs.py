"""A quantized cache's settings in its name (`quantized-hqq-int4@r256,g32`): what users tune memory
against quality with. `generate` really gets the settings, and a bad name is refused in one line that
says what is allowed; that the planner's bytes equal the real cache's for each setting is a set of rows of
`test_planned_equals_measured.py`.
"""

import pytest
import torch
from transformers import LlamaConfig, QuantizedCache

from kvsweep.caches import allowed_cache_names, get_strategy
from kvsweep.cli import main
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.measure.cache_identity import describe_cache, mismatch
from kvsweep.models.build import build_model
from kvsweep.models.presets import PRESETS
from kvsweep.models.resolve import classify, kv_shape, load_config
from kvsweep_testkit.cells import measure_cell

PROTO = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1).to_dict()
SHAPE = kv_shape(load_config(classify("tiny-llama")))  # 4 layers, 2 KV heads of 32


def run(cache: str, context: int, new: int, batch: int, dtype: str) -> tuple[Cell, dict]:
    cell = Cell("tiny-llama", dtype, context, batch, new, cache, False)
    return cell, measure_cell(cell.to_dict(), PROTO)


def test_hqq_int1_and_int3_bytes_by_hand():
    """bf16, 100 prompt tokens, 31 decoded (the residual). One layer's K (or V): 2 x 32 x 100 = 6400
    elements; the residual is 2 (K, V) x 4 layers x 2 heads x 32 x 31 tokens x 2 B = 31,744 B."""
    residual = 31_744
    # int1, groups of 32: 6400 / 8 = 800 B of codes; 200 groups x (scale + zero) x 2 B = 800 B; 8 tensors
    assert get_strategy("quantized-hqq-int1@g32").held_bytes(SHAPE, 1, "bfloat16", 100, 31) == 8 * 1600 + residual
    # int3, groups of 64: ten codes per int32 down a group's 64 rows (padded to 70) = 7 int32 per column,
    # 100 columns = 2800 B; 100 groups x (scale + zero) x 2 B = 400 B
    assert get_strategy("quantized-hqq-int3").held_bytes(SHAPE, 1, "bfloat16", 100, 31) == 8 * 3200 + residual
    # r16: 31 decoded = one flush at step 16 and 15 in the residual; 116 tokens quantized
    # int1: 2 x 32 x 116 = 7424 elements: 928 B codes + 116 groups x 4 B = 464 B
    assert get_strategy("quantized-hqq-int1@r16").held_bytes(SHAPE, 1, "bfloat16", 100, 31) == 8 * 1392 + 15_360


def test_generate_gets_the_settings_and_the_tag_names_them():
    _, result = run("quantized-quanto-int4@ak-1,g16,r16", 64, 4, 1, "bfloat16")
    assert result["status"] == "ok", result["error"]
    tag = result["tags"]["kvsweep.cache_class"]
    assert tag == "QuantizedCache/QuantoQuantizedLayer nbits=4 residual_length=16 q_group_size=16 axis_key=-1"
    _, plain = run("quantized-hqq-int4", 64, 4, 1, "bfloat16")
    assert plain["tags"]["kvsweep.cache_class"] == "QuantizedCache/HQQQuantizedLayer nbits=4"  # defaults unsaid


def test_a_cache_built_with_other_settings_is_a_mismatch():
    """Transformers' own cache with its defaults, where the strategy asks for r32,g32,av1: named, not logged."""
    cache = QuantizedCache(backend="hqq", config=LlamaConfig(**PRESETS["tiny-llama"].config), nbits=4)
    problem = mismatch(get_strategy("quantized-hqq-int4@r32,g32,av1"), describe_cache(cache), cached_tokens=64)
    assert problem is not None
    assert "differs in residual_length, q_group_size, axis_value" in problem
    assert mismatch(get_strategy("quantized-hqq-int4"), describe_cache(cache), cached_tokens=64) is None


def test_a_name_without_settings_is_todays_strategy():
    """Cell ids hash the cache name: a plain name must stay exactly what it was, with the same defaults."""
    plain = get_strategy("quantized-hqq-int4")
    assert plain.name == "quantized-hqq-int4"
    assert plain.generation_options()["cache_config"] == {
        "backend": "hqq",
        "nbits": 4,
        "residual_length": 128,  # Transformers' QuantizedLayer defaults
        "q_group_size": 64,
        "axis_key": 0,
        "axis_value": 0,
    }


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("quantized-hqq-int4@r256,g32", {"residual_length": 256, "q_group_size": 32, "axis_key": 0, "axis_value": 0}),
        ("quantized-quanto-int4@r64,ak-1", {"residual_length": 64, "q_group_size": 64, "axis_key": -1}),
        ("quantized-hqq-int2@av1,ak1,g16,r8", {"residual_length": 8, "q_group_size": 16, "axis_key": 1}),
        ("quantized-hqq-int3@g7", {"q_group_size": 7}),  # 3-bit codes pad a group's rows to ten: any size packs
    ],
)
def test_accepted_names_set_what_they_say(name, settings):
    strategy = get_strategy(name)
    assert strategy.name == name
    config = strategy.generation_options()["cache_config"]
    assert {key: config[key] for key in settings} == settings


REFUSED = [
    ("quantized-hqq-int4@x5", "bad setting 'x5'", "@r<residual length>,g<group size>,ak<key axis>,av<value axis>"),
    ("quantized-hqq-int4@", "bad setting ''", "r<residual length>"),
    ("quantized-hqq-int4@r0", "'r0'", "positive whole number"),
    ("quantized-hqq-int4@g-4", "'g-4'", "positive whole number"),
    ("quantized-hqq-int4@r64,r32", "r is given more than once", ""),
    ("quantized-hqq-int4@ak-1", "'ak-1'", "hqq's axes are 0 or 1"),
    ("quantized-quanto-int2@av1", "'av1'", "quanto's axes are 0 or -1"),
    ("quantized-hqq-int3@ak1", "ak1: HQQ 3-bit", "use axis 0"),
    ("quantized-hqq-int1@g20", "g20: HQQ 1-bit along axis 0", "multiple of 8"),
    ("dynamic@r64", "dynamic takes no @ part", "quantized-hqq-int4@r256,g32"),
    ("static@r64", "static@N needs a positive whole number", "quantized caches"),
    ("g32", "unknown cache 'g32'", "'grid.caches=[\"quantized-hqq-int4@r256,g32\"]'"),
]


@pytest.mark.parametrize(("name", "names", "allowed"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_names_say_what_is_wrong_and_what_is_allowed(name, names, allowed):
    with pytest.raises(KeyError) as refused:
        get_strategy(name)
    message = refused.value.args[0]
    assert "\n" not in message and repr(name) in message
    assert names in message and allowed in message


def test_a_refused_setting_is_a_one_line_config_error(capsys):
    assert main(['grid.caches=[dynamic,"quantized-hqq-int4@r64,ak2"]']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.endswith("grid.caches[1]: invalid cache 'quantized-hqq-int4@r64,ak2': 'ak2': hqq's axes are 0 or 1")


def test_an_unquoted_list_split_at_the_comma_is_explained(capsys):
    assert main(["grid.caches=[quantized-hqq-int4@r64,g32]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "grid.caches[1]: unknown cache 'g32': a comma inside [...] splits the list" in err


def test_allowed_names_show_the_settings_syntax():
    assert "quantized-hqq-int{1,2,3,4,8}" in allowed_cache_names()  # every bit width, on one line
    assert "@r<residual length>,g<group size>,ak<key axis>,av<value axis>" in allowed_cache_names()


@pytest.mark.parametrize(
    ("cache", "context", "new", "says"),
    [
        # quanto along axis -1 groups batch x heads x tokens = 2 x 100 = 200 elements: 64 does not divide it
        ("quantized-quanto-int2@ak-1", 100, 4, "must divide batch x kv_heads x tokens = 200"),
        # HQQ 4-bit along axis 1: 33 tokens x 64 elements / 64 = 33 groups, which do not pair into bytes
        ("quantized-hqq-int4@ak1", 33, 4, "33 tokens make 33 groups"),
        # fine at the prompt (64 tokens: 64 groups), not at the flush after 4 steps (68 groups: not 8 to a byte)
        ("quantized-hqq-int1@av1,r4", 64, 8, "68 tokens make 68 groups"),
    ],
)
def test_a_request_the_backend_cannot_quantize_is_named_before_it_runs(cache, context, new, says):
    """The same requests fail inside the backend when generate runs them, so the plan skips such a cell, saying
    what the backend would refuse."""
    problem = get_strategy(cache).request_problem(SHAPE, 1, context, new)
    assert problem is not None and says in problem, problem
    model = build_model(classify("tiny-llama"), "bfloat16", "cpu", seed=0)
    with pytest.raises((ValueError, RuntimeError)), torch.inference_mode():  # quanto refuses, HQQ mis-sizes
        ids = torch.zeros(1, context, dtype=torch.long)
        model.generate(ids, max_new_tokens=new, do_sample=False, **get_strategy(cache).generation_options())
    _, result = run(cache, context, new, 1, "bfloat16")
    assert result["status"] == "skipped" and says in result["error"]
    assert get_strategy("quantized-hqq-int4@ak1").request_problem(SHAPE, 1, 64, 40) is None
