"""What Transformers does with `static@N`: N is a floor, never a cap, which is why a too-small N is refused.

generate sizes a static cache to max(the request's length, `max_cache_len`): asked for 8 tokens with a
request holding 35, it silently reserves 35, a plain `static` cell under another name. The accounting and
the cache check assume that max; the config refuses an N below the longest request (test_config_bounds).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kvsweep.caches import get_strategy
from kvsweep.measure.cache_identity import describe_cache
from kvsweep.models.presets import PRESETS

PROMPT, NEW = 32, 4  # the cache holds 32 + 4 - 1 = 35 tokens: the last token's K/V is never computed


def reserved_length(cache: str) -> int | None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**PRESETS["tiny-llama"].config)).eval()  # fresh: generate remembers sizes
    out = model.generate(
        torch.randint(0, 100, (1, PROMPT)),
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        return_dict_in_generate=True,
        **get_strategy(cache).generation_options(),
    )
    assert out.sequences.shape[1] == PROMPT + NEW
    return describe_cache(out.past_key_values).max_cache_len


def test_a_reserve_below_the_request_is_sized_to_the_request_and_one_above_is_kept():
    assert reserved_length("static@8") == 35 == reserved_length("static")
    assert reserved_length("static@100") == 100
