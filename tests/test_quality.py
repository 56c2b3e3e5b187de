"""The quality measures on their own: KL against its definition, teacher forcing with real generate."""

import math

import pytest
import torch
from transformers import GenerationConfig

from kvsweep.measure.quality import ForceTokens, kl_divergence, record_reference, reference_rows, teacher_forced_kl
from kvsweep.models.build import build_model
from kvsweep.models.resolve import classify


def test_kl_matches_its_definition():
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    q = torch.tensor([[0.25, 0.25, 0.25, 0.25]])
    expected = 0.5 * math.log(0.5 / 0.25) + 2 * 0.25 * math.log(1.0)
    assert float(kl_divergence(p.log(), q.log())) == pytest.approx(expected, rel=1e-6)
    assert float(kl_divergence(q.log(), q.log())) == 0.0


def test_reference_keeps_within_its_memory_cap():
    assert reference_rows(batch=8, steps=32, vocab=1000) == 8
    assert reference_rows(batch=16, steps=256, vocab=128_256) == 8  # 1 GiB / (256 x 128256 x 4 B)
    assert reference_rows(batch=4, steps=100_000, vocab=1_000_000) == 1


@pytest.fixture(scope="module")
def model():
    return build_model(classify("tiny-llama"), "float32", "cpu", seed=0, trust_remote_code=False)


def _generate(model, inputs, cache, processors):
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    config.cache_implementation = cache
    out = model.generate(inputs, generation_config=config, logits_processor=processors)
    return out[:, inputs.shape[1] :]


def test_forced_tokens_are_what_generate_returns(model):
    inputs = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    wanted = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    got = _generate(model, inputs, "dynamic", [ForceTokens(wanted, prompt_length=12)])
    assert torch.equal(got, wanted)


def test_same_cache_gives_zero_divergence(model):
    inputs = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))

    def generate(processors):
        return _generate(model, inputs, "dynamic", processors)

    tokens, reference = record_reference(generate, rows=1)
    assert len(reference) == 8 and reference[0].shape == (1, model.config.vocab_size)
    kl = teacher_forced_kl(generate, tokens, reference, prompt_length=12)
    assert kl["kl_divergence"] == pytest.approx(0.0, abs=1e-7)
