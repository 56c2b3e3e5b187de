"""`quantized-fp8`: Transformers' FP8 cache, as kvsweep names, asks for and reads it.

The dequantized values are worked out by an e4m3 rounding written here from the format's definition (3 mantissa
bits, exponent bias 7, largest finite 448), not by torch's cast.
"""

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.cache_utils import QuantizedCache

from kvsweep.caches import get_strategy

E4M3_MAX = 448.0


def e4m3(value: float) -> float:
    """Round to the nearest float8_e4m3fn value, ties to even: normals have 3 mantissa bits from 2^-6 up,
    subnormals are multiples of 2^-9."""
    magnitude = abs(value)
    step = 2.0**-9 if magnitude < 2.0**-6 else 2.0 ** (math.floor(math.log2(magnitude)) - 3)
    units = magnitude / step
    rounded = math.floor(units)
    if units - rounded > 0.5 or (units - rounded == 0.5 and rounded % 2):
        rounded += 1
    return math.copysign(min(rounded * step, E4M3_MAX), value)


def test_the_cache_gives_back_each_value_rounded_to_e4m3_at_the_prompts_scale():
    """The scale is the prompt's largest magnitude / 448, frozen: here 7 / 448 = 1/64 exactly. A later token is
    coded at that scale too, so its error is the prompt's, whatever its own range."""
    config = LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1)
    cache = QuantizedCache(backend="fp8", config=config)
    prompt = torch.tensor([7.0, 0.1, -0.3, 0.0123, 1.7, -2.9, 0.004, 3.3]).reshape(1, 1, 1, 8)
    later = torch.tensor([0.05, -6.9, 2.2, 0.001, -0.77, 5.5, 0.3, -0.02]).reshape(1, 1, 1, 8)
    first_keys, _ = cache.update(prompt, prompt, 0)
    assert torch.equal(first_keys, prompt)  # the prefill attends over its own states, unquantized
    keys, values = cache.update(later, later, 0)
    scale = 7.0 / E4M3_MAX
    expected = [e4m3(v / scale) * scale for v in (*prompt.flatten().tolist(), *later.flatten().tolist())]
    assert keys.flatten().tolist() == pytest.approx(expected, rel=0, abs=1e-9)
    assert values.flatten().tolist() == pytest.approx(expected, rel=0, abs=1e-9)
    assert keys.flatten()[1].item() == pytest.approx(0.1015625)  # 0.1 x 64 = 6.4 -> 6.5 (steps of 0.5 in [4, 8))


def test_fp8_is_asked_for_with_its_backend_only():
    """Transformers refuses any group-wise setting for the fp8 backend, so none may reach `cache_config`."""
    options = get_strategy("quantized-fp8").generation_options()
    assert options == {"cache_implementation": "quantized", "cache_config": {"backend": "fp8"}}
    QuantizedCache(config=LlamaConfig(num_hidden_layers=1), **options["cache_config"])  # accepted as given


def test_fp8_settings_are_refused_in_one_line():
    with pytest.raises(KeyError) as refused:
        get_strategy("quantized-fp8@r64")
    line = str(refused.value)
    assert "quantized-fp8@r64" in line and "per tensor" in line and "\n" not in line
