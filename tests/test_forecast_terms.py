"""The forecast's terms against arithmetic done by hand here, never against what the code printed."""

import pytest

from kvsweep.forecast import sustained
from kvsweep.forecast.terms import (
    Forecast,
    Term,
    decode_seconds,
    duration,
    load_seconds,
    prefill_flops,
    prefill_seconds,
    sci,
)

# An 8B Llama-shaped decoder: 32 layers, hidden (= heads x head_dim) 4096.
PARAMS, LAYERS, HIDDEN = 8_000_000_000, 32, 4096


def test_an_8b_prefill_of_1000_tokens_is_2_x_params_x_tokens_plus_causal_attention():
    matmuls = 2 * 8e9 * 1000  # 1.6e13: one multiply-add (2 FLOP) per weight per token
    # QK^T and AV: 2 matmuls x 2 FLOP x 32 layers x 4096 x 1000^2, half of it under a causal mask: 2.62144e11
    attention = 2 * 32 * 4096 * 1_000_000
    assert matmuls == 1.6e13
    assert attention == 262_144_000_000
    assert prefill_flops(PARAMS, 1000, LAYERS, HIDDEN) == pytest.approx(16_262_144_000_000, rel=1e-12)


def test_a_batch_multiplies_the_prefill_and_attention_grows_with_the_square_of_the_tokens():
    one = prefill_flops(PARAMS, 1000, LAYERS, HIDDEN)
    assert prefill_flops(PARAMS, 1000, LAYERS, HIDDEN, batch=4) == pytest.approx(4 * one)
    # Doubling the tokens doubles the matmuls (3.2e13) and quadruples attention (1.048576e12).
    assert prefill_flops(PARAMS, 2000, LAYERS, HIDDEN) == pytest.approx(3.2e13 + 1_048_576_000_000)
    # Without weights, what is left is attention alone: 2 x 32 x 4096 x 10^2 at 10 tokens.
    assert prefill_flops(0, 10, LAYERS, HIDDEN) == 2 * 32 * 4096 * 100


def test_prefill_seconds_divide_by_the_sustained_rate():
    # 1.6e13 FLOP on an H100 SXM's 989.4e12 FLOP/s at 0.6 of it: 1.6e13 / 5.9364e14 = 0.026952...
    assert prefill_seconds(1.6e13, 989.4e12 * 0.6) == pytest.approx(0.0269523617, rel=1e-9)


def test_decode_seconds_are_bytes_over_bandwidth_plus_the_steps_overhead():
    # 16 GB of bf16 weights at 3.2 TB/s: 5 ms; plus 1 ms of host time.
    assert decode_seconds(16e9, 3.2e12, overhead_s=0.0) == pytest.approx(0.005)
    assert decode_seconds(16e9, 3.2e12, overhead_s=0.001) == pytest.approx(0.006)


def test_an_offloaded_caches_host_link_bytes_add_in_series():
    # 2 GB there and back at 25 GB/s: 80 ms, after the 5 ms of reads and 1 ms of overhead.
    seconds = decode_seconds(16e9, 3.2e12, host_link_bytes=2e9, host_link_bandwidth=25e9, overhead_s=0.001)
    assert seconds == pytest.approx(0.086)


def test_host_link_bytes_without_a_link_rate_are_refused():
    with pytest.raises(ValueError, match="host-link bandwidth"):
        decode_seconds(16e9, 3.2e12, host_link_bytes=2e9)


def test_the_default_step_overhead_is_a_32_layer_decoders():
    assert decode_seconds(0.0, 1.0) == pytest.approx(32 * sustained.LAYER_OVERHEAD_S)
    assert sustained.step_overhead_s(80) == pytest.approx(80 * sustained.LAYER_OVERHEAD_S)


def test_load_seconds_are_bytes_over_the_rate():
    assert load_seconds(16e9, 2e9) == 8.0


def test_the_sustained_fractions_are_shares():
    for fraction in (sustained.GPU_FLOP_FRACTION, sustained.GPU_BANDWIDTH_FRACTION, sustained.HOST_LINK_FRACTION):
        assert 0 < fraction <= 1


def test_a_forecast_sums_its_terms_and_names_the_largest():
    terms = (Term("load", 8.0, "16 GB ÷ 2 GB/s"), Term("prefill", 2.0), Term("decode", 30.0, "many steps"))
    bill = Forecast(terms)
    assert bill.total == 40.0
    assert bill.largest == terms[2]
    assert Forecast().largest is None and Forecast().total == 0


def test_describe_gives_one_line_per_term_with_its_share():
    bill = Forecast((Term("load", 8.0, "16 GB ÷ 2 GB/s"), Term("prefill", 2.0), Term("decode", 30.0, "many steps")))
    lines = bill.describe().splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["load", "8", "s", "20%", "16", "GB", "÷", "2", "GB/s"]  # 8 of 40 s
    assert lines[1].split() == ["prefill", "2", "s", "5%"]
    assert lines[2].split() == ["decode", "30", "s", "75%", "many", "steps"]


def test_numbers_are_written_as_a_person_writes_them():
    assert sci(1.6e13) == "1.6e13"
    assert sci(0.0025) == "2.5e-3"
    assert [duration(s) for s in (0.00084, 0.0123, 4.2, 210, 7560)] == [
        "840 µs",
        "12.3 ms",
        "4.2 s",
        "3.5 min",
        "2.1 h",
    ]


def test_a_sliding_window_layer_attends_to_at_most_its_window():
    """1,000 tokens under a causal mask: 1000² / 2 = 500,000 (query, key) pairs in full; a window of 128 attends
    like a full layer for the first 128 queries (128² / 2 = 8,192) and to 128 keys for each of the other 872
    (111,616): 119,808. A layer that keeps no keys attends to none."""
    from kvsweep.forecast.terms import attended_pairs

    assert attended_pairs(1000, None) == 500_000
    assert attended_pairs(1000, 128) == 8_192 + 872 * 128 == 119_808
    assert attended_pairs(100, 128) == 5_000  # shorter than its window: as a full layer
    assert attended_pairs(1000, 0) == 0
    # One full and one windowed layer of width 64, no weights: 2 × 2 × 64 × (500,000 + 119,808)
    assert prefill_flops(0, 1000, 2, 64, windows=(None, 128)) == 4 * 64 * 619_808


def test_gpt_oss_20b_prefills_with_its_active_parameters_and_its_heads_width():
    """gpt-oss-20b routes each token to 4 of its 32 experts: OpenAI's model card gives 3.61B active parameters
    without the embeddings, and the unembedding (201,088 × 2,880 = 0.579B) multiplies every token too; its
    attention is 64 heads × 64 = 4,096 wide (its hidden size is 2,880) and every other layer a 128-token window."""
    from kvsweep.forecast.cell_forecast import active_parameters
    from kvsweep.models.facts import read_facts
    from kvsweep.models.resolve import classify

    facts = read_facts(classify("gpt-oss-20b"))
    shape = facts.shape
    assert facts.parameters == pytest.approx(20.91e9, rel=2e-3)  # the card's total
    active = active_parameters(facts.parameters, shape)
    assert active == pytest.approx(3.61e9 + 201_088 * 2_880, rel=1e-2)
    assert shape.attention_width == 4096 and shape.hidden_size == 2880
    tokens = 8192
    full, window = tokens**2 / 2, 128**2 / 2 + (tokens - 128) * 128
    by_hand = 2 * active * tokens + 2 * 2 * 4096 * 12 * (full + window)
    assert prefill_flops(active, tokens, shape.layers, shape.attention_width, windows=shape.layer_windows) == (
        pytest.approx(by_hand, rel=1e-12)
    )


def test_a_mixture_of_experts_decode_step_reads_the_experts_its_tokens_chose():
    """One sequence: 4 of 32 experts a layer, so the step reads the shared weights and 4/32 of the experts' (the
    active parameters' bytes); 64 sequences routed evenly leave an expert untouched with probability (28/32)^64 =
    1.9e-4: nearly every weight is read."""
    from kvsweep.forecast.cell_forecast import ModelCost, active_parameters, weights_read
    from kvsweep.models.facts import read_facts
    from kvsweep.models.resolve import classify

    facts = read_facts(classify("gpt-oss-20b"))
    model = ModelCost(facts.parameters, 2 * facts.parameters, facts.shape)  # bfloat16: 2 bytes a weight
    assert weights_read(model, 1) == pytest.approx(2 * active_parameters(facts.parameters, facts.shape))
    experts = 24 * 32 * facts.shape.expert_parameters
    untouched = experts * (28 / 32) ** 64
    assert weights_read(model, 64) == pytest.approx(2 * (facts.parameters - untouched))
    dense = read_facts(classify("llama-3.1-8b"))
    llama = ModelCost(dense.parameters, 2 * dense.parameters, dense.shape)
    assert weights_read(llama, 1) == weights_read(llama, 64) == 2 * dense.parameters
