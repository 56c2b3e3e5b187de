"""What one decode step moves for its cache, by path: device memory, and the host link of an offloaded cache.

Every expectation is worked out here from how Transformers' cache layers run a step, not from
kvsweep's byte accounting.
"""

import pytest

from kvsweep.caches import get_strategy
from kvsweep.models.shape import KvShape
from kvsweep.plan.kv_prediction import decode_kv_traffic

# 3 layers, 2 KV heads of 4: one cached token is 2 (K, V) x 3 x 2 x 4 = 48 elements; batch 2, float32
SMALL = KvShape(layers=3, kv_heads=2, head_dim=4, max_positions=None)
TOKEN_BYTES = 48 * 2 * 4  # 384 bytes per cached token, batch 2, float32


def traffic(cache: str, prompt: int, new: int, shape: KvShape = SMALL, batch: int = 2, dtype: str = "float32"):
    return decode_kv_traffic(get_strategy(cache), shape, batch, dtype, prompt, new)


def test_a_dynamic_cache_step_reads_the_cache_after_its_update_and_uses_no_host_link():
    # prompt 5, 3 new tokens: decode steps 1 and 2 attend over 6 and 7 tokens
    got = traffic("dynamic", prompt=5, new=3)
    assert got.device_bytes == pytest.approx(TOKEN_BYTES * (6 + 7) / 2)
    assert got.host_link_bytes == 0.0


def test_an_offloaded_step_moves_every_layer_to_the_device_and_back_and_attends_there():
    # Each step prefetches each layer as it was (5 + j - 1 tokens) and offloads it after the update (5 + j)
    got = traffic("offloaded", prompt=5, new=3)
    assert got.host_link_bytes == pytest.approx(TOKEN_BYTES * ((5 + 6) + (6 + 7)) / 2)  # 4,608 bytes
    # attention reads each layer on the device, the one resident and the ones just brought in alike
    assert got.device_bytes == pytest.approx(traffic("dynamic", prompt=5, new=3).device_bytes)


@pytest.mark.parametrize("cache, allocated_tokens", [("offloaded_static", 5 + 3 - 1), ("offloaded_static@16", 16)])
def test_an_offloaded_static_step_moves_its_whole_allocation_both_ways(cache, allocated_tokens):
    got = traffic(cache, prompt=5, new=3)
    assert got.device_bytes == pytest.approx(TOKEN_BYTES * allocated_tokens)
    assert got.host_link_bytes == pytest.approx(2 * TOKEN_BYTES * allocated_tokens)


def test_no_decode_step_no_traffic():
    assert traffic("offloaded", prompt=5, new=1) == traffic("dynamic", prompt=5, new=1)
    assert traffic("quantized-hqq-int4", prompt=5, new=1).device_bytes == 0.0


# 2 layers, 2 KV heads of 64, batch 1, float16: one layer's K for one token is 128 elements, two
# quantization groups of 64; one token of every layer's K and V is 2 x 2 x 128 x 2 = 1,024 bytes.
GROUPED = KvShape(layers=2, kv_heads=2, head_dim=64, max_positions=None)


@pytest.mark.parametrize("cache", ["quantized-hqq-int4", "quantized-quanto-int4"])
def test_a_quantized_step_counts_the_dense_copies_it_materialises_by_hand(cache):
    """Prompt 4, 4 new tokens: the prompt stays packed, the residual holds 0, 1, 2 tokens before steps 1-3.

    Packed prompt, one layer's K: 512 elements, 4 bits each = 256 bytes, and 8 groups with a float16
    scale and zero = 32 bytes; 288 x 2 (K, V) x 2 layers = 1,152 bytes (quanto packs two 4-bit rows of
    a group per byte row: the same 256 bytes here). Each step reads that and the residual and the new
    token, writes the dequantized prompt (4 tokens, 4,096 bytes) and reads it back into the concatenation,
    which writes 4 + j tokens and attention reads them.
    """
    steps = [1152 + 1024 * residual + 1024 + 2 * 4096 + 2 * 1024 * (4 + j) for j, residual in ((1, 0), (2, 1), (3, 2))]
    assert steps == [20_608, 23_680, 26_752]
    got = traffic(cache, prompt=4, new=4, shape=GROUPED, batch=1, dtype="float16")
    assert got.device_bytes == pytest.approx(sum(steps) / 3)
    assert got.host_link_bytes == 0.0


def replay_quantized_layer_updates(prompt: int, new: int, nbits: int, residual_length: int = 128) -> float:
    """Replays `QuantizedLayer.update` on GROUPED (batch 1, float16, HQQ packing): mean bytes per decode step.

    The prompt is packed at the first update. A step dequantizes the packed part, concatenates it with
    the residual and the new token for attention, then appends the token to the residual, or, when the
    residual would reach `residual_length`, re-packs everything and empties the residual.
    """
    elements = 2 * 64  # one layer's K (or V) per token
    tensors = 2 * 2  # K and V of 2 layers

    def dense(tokens: int) -> int:
        return tensors * elements * tokens * 2

    def packed(tokens: int) -> int:
        codes = elements * tokens * nbits // 8
        scales_and_zeros = elements * tokens // 64 * 2 * 2
        return tensors * (codes + scales_and_zeros)

    packed_tokens, residual, total = prompt, 0, 0
    for _ in range(1, new):
        attended = packed_tokens + residual + 1
        total += packed(packed_tokens) + dense(residual) + dense(1)  # read: payload, residual, new token
        total += 2 * dense(packed_tokens)  # the dequantized copy, written, then read by the concatenation
        total += 2 * dense(attended)  # the concatenated K and V, written, then read by attention
        if residual + 1 >= residual_length:
            packed_tokens, residual = attended, 0
        else:
            residual += 1
    return total / (new - 1)


@pytest.mark.parametrize("prompt, new", [(130, 140), (64, 300)])
def test_a_quantized_decode_through_residual_flushes_matches_a_replay_of_the_layer(prompt, new):
    got = traffic("quantized-hqq-int2", prompt=prompt, new=new, shape=GROUPED, batch=1, dtype="float16")
    assert got.device_bytes == pytest.approx(replay_quantized_layer_updates(prompt, new, nbits=2))


def test_an_fp8_step_counts_its_codes_and_the_float32_widening_by_hand():
    """SMALL (48 K and V elements a token, batch 2: 96 a token), prompt 5, 3 new, float32. Before step j the cache
    holds 5 + j - 1 tokens of one-byte codes plus 3 layers x 2 float32 scales (24 bytes). Step j, t = 5 + j tokens,
    e = 96 t: read the held codes and scales, read the new token (384 bytes), write e codes, read e codes, write 4e
    (widened), read and write 4e (scaled; float32, so no cast), attention reads 384 t.
    Step 1 (t 6, e 576): 5 x 96 + 24 + 384 + 576 + 576 + 2304 + 4608 + 2304 = 11,256.
    Step 2 (t 7, e 672): 6 x 96 + 24 + 384 + 672 + 672 + 2688 + 5376 + 2688 = 13,080."""
    got = traffic("quantized-fp8", prompt=5, new=3)
    assert got.device_bytes == pytest.approx((11_256 + 13_080) / 2)
    assert got.host_link_bytes == 0.0
    # bfloat16, one step (t 6, e 576): the dense reads halve (192 the new token, 2e attention) and the cast back to
    # the model's dtype reads 4e and writes 2e
    bf16 = traffic("quantized-fp8", prompt=5, new=2, dtype="bfloat16")
    e = 576
    assert bf16.device_bytes == pytest.approx(5 * 96 + 24 + 192 + e + e + 4 * e + 8 * e + 4 * e + 2 * e + 2 * e)
