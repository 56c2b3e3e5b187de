"""Weight quantization: where a model's weights are, what each scheme stores, and that a preset's in-place
quantization is the one Transformers' loader applies (fast: tiny models on CPU, no Ray, no sweep)."""

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kvsweep.models.build import fill_random_weights
from kvsweep.models.presets import PRESETS, Preset
from kvsweep.models.quantize_weights import prequantized_label, quantization_config, quantize_built_model, stored_bytes
from kvsweep.models.resolve import ModelRef, load_config, meta_model
from kvsweep.models.weight_layout import Block, Linear, WeightLayout, layout_of_module, layout_of_preset
from kvsweep.models.weight_schemes import WEIGHT_SCHEMES, layout_bytes, linear_bytes, scheme_problem, weight_scheme

QUANTO = ("quanto-int8", "quanto-int4")
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2}

# qwen2: biased q/k/v; hidden 160 gives quanto int4 groups of 32 (five a row: an odd number of groups for the
# 201 gate/up rows), intermediate 201 no group at all (a whole row each)
ODD_QWEN2 = Preset(
    "odd-qwen2",
    "qwen2",
    dict(
        vocab_size=300,
        hidden_size=160,
        intermediate_size=201,
        num_hidden_layers=2,
        num_attention_heads=5,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
)
# gpt-oss: biased attention, sinks, a router and fused experts that are no nn.Linear; hidden 192: groups of 96
TINY_GPT_OSS = replace(
    PRESETS["gpt-oss-20b"],
    name="tiny-gpt-oss",
    config={
        **PRESETS["gpt-oss-20b"].config,
        **dict(
            vocab_size=256,
            hidden_size=192,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=3,
            num_key_value_heads=1,
            layer_types=["sliding_attention", "full_attention"],
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    },
)
# gemma3_text with tied embeddings: Transformers' default skips are the tied pair and the last module (the norm)
TIED_GEMMA3 = Preset(
    "tied-gemma3",
    "gemma3_text",
    dict(
        vocab_size=320,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=256,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
    ),
)


def built(preset: Preset, dtype: torch.dtype) -> Any:
    """A preset's model with seeded random weights, as kvsweep builds presets (config → model, tied, filled)."""
    config = AutoConfig.for_model(preset.model_type, **preset.config)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    fill_random_weights(model, seed=0)
    return model.eval()


def quantized_names(model: Any) -> set[str]:
    from optimum.quanto import QModuleMixin

    return {name for name, module in model.named_modules() if isinstance(module, QModuleMixin)}


def storage_shape(model: Any) -> dict[str, tuple]:
    """Every state tensor's class and inner tensors' shapes and dtypes: what "the same storage" means."""
    shapes = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        flat = tensor.__tensor_flatten__()[0] if type(tensor) not in (torch.Tensor, torch.nn.Parameter) else []
        inner = tuple((n, tuple(getattr(tensor, n).shape), getattr(tensor, n).dtype) for n in flat)
        shapes[name] = (type(tensor).__name__, tuple(tensor.shape), tensor.dtype, inner)
    return shapes


# --- layouts -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_layout_is_the_meta_models_block_by_block(name: str) -> None:
    preset = PRESETS[name]
    model = meta_model(load_config(ModelRef(name, "preset")))
    from_module = layout_of_module(model, preset.config["num_hidden_layers"])
    from_config = layout_of_preset(preset)
    assert from_config.first == from_module.first
    assert from_config.last == from_module.last
    assert len(from_config.layers) == len(from_module.layers) == preset.config["num_hidden_layers"]
    for index, (mine, theirs) in enumerate(zip(from_config.layers, from_module.layers, strict=True)):
        assert mine == theirs, f"layer {index}"
    assert from_config.elements() == preset.parameters() == sum(p.numel() for p in model.parameters())


def test_layout_keeps_linears_apart_from_the_rest() -> None:
    """gpt-oss: experts and router are no nn.Linear; a tied head adds nothing after the layers."""
    gpt_oss = layout_of_preset(PRESETS["gpt-oss-20b"])
    assert {(lin.in_features, lin.out_features, lin.bias, lin.count) for lin in gpt_oss.layers[0].linears} == {
        (2880, 4096, True, 1),  # q
        (2880, 512, True, 2),  # k, v
        (4096, 2880, True, 1),  # o
    }
    assert gpt_oss.last.linears == (Linear(2880, 201088, False),)
    tied = layout_of_preset(PRESETS["smollm2-135m"])
    assert tied.last == Block((), 576) and tied.first == Block((), 49152 * 576)


def test_planning_a_preset_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from kvsweep.models.presets import PRESETS\n"
        "from kvsweep.models.weight_layout import layout_of_preset\n"
        "from kvsweep.models.weight_schemes import layout_bytes\n"
        "from kvsweep.models.weight_schemes import weight_scheme, scheme_problem\n"
        "layout_bytes(layout_of_preset(PRESETS['llama-3.1-8b']), weight_scheme('bnb-nf4'), 2)\n"
        "scheme_problem('quanto-int4', 'cpu', lambda name: True)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- exact bytes ---------------------------------------------------------------------------------------------------


def test_hand_computed_figures() -> None:
    """Worked out from what each backend stores, independent of the formula's code path."""
    int8, int4 = weight_scheme("quanto-int8"), weight_scheme("quanto-int4")
    # tiny-llama's q_proj, Linear(128, 128), float32, quanto int8: 128*128 int8 data + 128 float32 row scales
    # + input_scale and output_scale, two float32 scalars = 16384 + 512 + 8
    assert linear_bytes(int8, Linear(128, 128, False), 4) == 16_904
    # its down_proj, Linear(256, 128), bfloat16, quanto int4: groups of 128, 2 a row, 256 in all; data half a
    # byte a weight = 16384; a bfloat16 scale and shift per group = 256*2*2 = 1024; + 8 for the two scalars
    assert linear_bytes(int4, Linear(256, 128, False), 2) == 17_416
    # q_proj at int4: 128 inputs is no more than a group: one scale and shift per row, 128 rows of 64 packed bytes
    assert linear_bytes(int4, Linear(128, 128, False), 2) == 64 * 128 + 128 * 2 * 2 + 8
    # a biased qwen2 k_proj Linear(160, 32) at int4, float32: groups of 32, 5 a row, 160 groups: 80 packed rows
    # of 32 bytes, 160 scales and shifts of 4 bytes, 32 float32 biases
    assert linear_bytes(int4, Linear(160, 32, True), 4) == 80 * 32 + 160 * 2 * 4 + 8 + 32 * 4
    # bitsandbytes NF4, Linear(4096, 4096): 8 MiB packed, 262144 float32 absmax (blocks of 64), a 16-float code
    assert linear_bytes(weight_scheme("bnb-nf4"), Linear(4096, 4096, False), 2) == 8_388_608 + 1_048_576 + 64
    # bitsandbytes int8: int8 weights and a float32 scale per row
    assert linear_bytes(weight_scheme("bnb-int8"), Linear(4096, 1024, False), 2) == 4_194_304 + 4096
    # torchao tinygemm: in padded to 1024, out to 8: Linear(2880, 500) stores 3072 x 504 at half a byte,
    # and 24 groups x 504 rows x (scale, zero) in bfloat16
    assert linear_bytes(weight_scheme("torchao-int4"), Linear(2880, 500, False), 2) == 774_144 + 48_384
    # no scheme: the dtype's bytes
    assert linear_bytes(None, Linear(10, 20, True, count=3), 2) == 3 * (200 + 20) * 2


def test_hand_computed_figures_are_what_quanto_stores() -> None:
    model = built(PRESETS["tiny-llama"], torch.bfloat16)
    quantize_built_model(model, weight_scheme("quanto-int4"))
    assert stored_bytes(model.model.layers[0].mlp.down_proj) == 17_416
    assert stored_bytes(model.model.layers[0].self_attn.q_proj) == 64 * 128 + 128 * 2 * 2 + 8


@pytest.mark.parametrize("scheme", QUANTO)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("preset", [PRESETS["tiny-llama"], ODD_QWEN2, TINY_GPT_OSS, TIED_GEMMA3], ids=lambda p: p.name)
def test_stored_bytes_are_the_layouts(preset: Preset, dtype: torch.dtype, scheme: str) -> None:
    model = built(preset, dtype)
    assert stored_bytes(model) == layout_bytes(layout_of_preset(preset), None, DTYPE_BYTES[dtype])
    quantize_built_model(model, weight_scheme(scheme))
    assert quantized_names(model)
    assert stored_bytes(model) == layout_bytes(layout_of_preset(preset), weight_scheme(scheme), DTYPE_BYTES[dtype])
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


# --- the same modules, the same storage, as Transformers' loader ---------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "dtype", "scheme"),
    [
        (PRESETS["tiny-llama"], torch.float32, "quanto-int8"),
        (PRESETS["tiny-llama"], torch.bfloat16, "quanto-int4"),  # tinygemm packing for the 256-input down_proj
        (TIED_GEMMA3, torch.float32, "quanto-int4"),  # tied head, the norm as last module
        (ODD_QWEN2, torch.bfloat16, "quanto-int8"),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_in_place_quantization_is_from_pretrained(preset: Preset, dtype: torch.dtype, scheme: str, tmp_path) -> None:
    model = built(preset, dtype)
    model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=dtype, quantization_config=quantization_config(weight_scheme(scheme), dtype)
    ).eval()
    quantize_built_model(model, weight_scheme(scheme))

    assert quantized_names(model) == quantized_names(loaded)
    assert "lm_head" not in quantized_names(model)
    assert storage_shape(model) == storage_shape(loaded)
    assert stored_bytes(model) == stored_bytes(loaded)
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, loaded(tokens).logits)


# --- what can run where --------------------------------------------------------------------------------------------


def test_scheme_problem() -> None:
    installed = lambda name: True  # noqa: E731
    assert scheme_problem("bnb-nf4", "cpu", installed) == "bnb-nf4 weights need CUDA; cells run on cpu"
    assert scheme_problem("bnb-int8", "cuda", installed) is None
    assert scheme_problem("none", "cpu", lambda name: False) is None
    assert scheme_problem("quanto-int4", "cpu", lambda name: name != "optimum.quanto") == (
        "quanto-int4 weights need the 'optimum.quanto' package (pip install optimum-quanto)"
    )
    assert scheme_problem("torchao-int4", "cuda:1", lambda name: False) == (
        "torchao-int4 weights need the 'torchao' package (pip install torchao)"
    )
    assert scheme_problem("torchao-int4", "cuda", installed, dtype="float16") == (
        "torchao-int4 weights need bfloat16; cells use float16"
    )
    assert scheme_problem("torchao-int4", "cuda", installed, dtype="bfloat16") is None


def test_unknown_scheme_is_one_line() -> None:
    with pytest.raises(ValueError) as err:
        scheme_problem("quanto-int3", "cpu", lambda name: True)
    message = str(err.value)
    assert "\n" not in message and "'quanto-int3'" in message
    assert all(name in message for name in ("none", *WEIGHT_SCHEMES))
    assert weight_scheme("none") is None


def test_quantization_configs() -> None:
    from transformers import QuantoConfig

    assert quantization_config(weight_scheme("quanto-int4"), torch.bfloat16).weights == "int4"
    assert isinstance(quantization_config(weight_scheme("quanto-int8"), torch.bfloat16), QuantoConfig)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_bnb_nf4_computes_in_the_cells_dtype_not_float32(dtype: torch.dtype) -> None:
    """Left unset, Transformers would set float32 and bitsandbytes would cast every forward to it."""
    from transformers import BitsAndBytesConfig

    nf4 = quantization_config(weight_scheme("bnb-nf4"), dtype)
    assert isinstance(nf4, BitsAndBytesConfig) and nf4.bnb_4bit_quant_type == "nf4" and nf4.load_in_4bit
    assert nf4.bnb_4bit_compute_dtype == dtype
    assert nf4.to_dict()["bnb_4bit_compute_dtype"] == str(dtype).removeprefix("torch.")  # as a checkpoint saves it


# --- checkpoints quantized already ---------------------------------------------------------------------------------


def quantized(**section: Any) -> dict:
    return {"model_type": "llama", "quantization_config": section}


@pytest.mark.parametrize(
    ("config", "label"),
    [
        (quantized(quant_method="awq", bits=4, group_size=128, version="gemm"), "awq-int4"),
        (quantized(quant_method="gptq", bits=4, group_size=128, desc_act=False), "gptq-int4"),
        (quantized(quant_method="gptq", bits=8), "gptq-int8"),
        (quantized(quant_method="fp8", weight_block_size=[128, 128]), "fp8"),
        (quantized(quant_method="fbgemm_fp8"), "fp8"),
        (quantized(quant_method="bitsandbytes", load_in_4bit=True, bnb_4bit_quant_type="nf4"), "bnb-nf4"),
        (quantized(quant_method="bitsandbytes", load_in_8bit=True), "bnb-int8"),
        (quantized(_load_in_4bit=True, bnb_4bit_quant_type="fp4"), "bnb-fp4"),  # an old config: no quant_method
        (quantized(quant_method="compressed-tensors", format="pack-quantized"), "compressed-tensors"),
        (quantized(quant_method="mxfp4"), "mxfp4"),
        (quantized(quant_method="quanto", weights="int4"), "quanto-int4"),
        ({"model_type": "gemma3", "text_config": quantized(quant_method="awq", bits=4)}, "awq-int4"),
        ({"model_type": "llama", "hidden_size": 4096}, None),
        ({"model_type": "llama", "quantization_config": None, "text_config": {}}, None),
    ],
)
def test_prequantized_label(config: dict, label: str | None) -> None:
    assert prequantized_label(config) == label


def test_prequantized_label_of_a_real_transformers_config() -> None:
    from transformers import QuantoConfig

    model = meta_model(load_config(ModelRef("tiny-llama", "preset")))
    assert prequantized_label(model.config.to_dict()) is None
    model.config.quantization_config = QuantoConfig(weights="int8")
    assert prequantized_label(model.config.to_dict()) == "quanto-int8"


def test_layout_bytes_of_a_block_quantizes_its_linears_and_of_a_model_not_the_head() -> None:
    scheme = weight_scheme("quanto-int8")
    head = Block((Linear(8, 100, False),), 8)
    layer = Block((Linear(8, 8, True, 2),), 16)
    layout = WeightLayout(first=Block((), 800), layers=(layer,), last=head)
    assert layout_bytes(layer, scheme, 2) == 2 * (64 + 8 * 2 + 8 + 8 * 2) + 16 * 2
    assert layout_bytes(layout, scheme, 2) == 800 * 2 + layout_bytes(layer, scheme, 2) + (800 + 8) * 2
    assert layout_bytes(layout, None, 2) == layout.elements() * 2
