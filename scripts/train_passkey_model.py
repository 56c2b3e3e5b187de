"""Train the small Llama that `tests/fixtures/passkey-llama` holds: a model that really solves kvsweep's passkey task.

Random-weight models answer nothing, so a quality check run on them cannot tell a lossless cache from a
destructive one. This script builds a byte-level BPE tokenizer on the filler (every digit its own
token, a BOS from the post-processor, no chat template) and trains a 2-layer Llama on prompts made by
`kvsweep.inputs.prompts.build_prompts` itself, the key appended as the target, so what it learns is
exactly the format kvsweep asks. Training seeds start at 1000; kvsweep's cells use seed 0, kept for
evaluation.

Reproducible: the tokenizer, the initial weights and every batch follow from `--seed`; the same seed gives
the same weights up to CPU float nondeterminism (thread scheduling in the matmuls), unless `--minutes` runs
out first (then fewer steps are taken, and a slower machine stops sooner).

    python scripts/train_passkey_model.py [--out tests/fixtures/passkey-llama] [--minutes 8] [--caches]
"""

import argparse
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, QuantizedCache

from kvsweep.inputs.filler import paragraph
from kvsweep.inputs.passkey import ANSWER_LEAD, INTRO, QUESTION, needle
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.prompts import build_prompts
from kvsweep.inputs.scoring import answer_correct
from kvsweep.inputs.spec import PASSKEY, InputSpec

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "passkey-llama"
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
VOCAB_SIZE = 1024
CORPUS_PARAGRAPHS = 4000  # of the filler, for the tokenizer's merges
EVAL_SPEC = InputSpec(depths=(0.1, 0.5, 0.9), chat_template=True, quality_trials=16)
# Training spreads the needle over the whole filler, so no depth is one the model never saw.
TRAIN_SPEC = InputSpec(depths=tuple(i / 20 for i in range(21)), chat_template=True, quality_trials=16)
TRAIN_SEED_BASE = 1000  # training prompts use seeds 1000 + step; cells use 0
EVAL_SEED = 0
EVAL_CONTEXTS = (128, 256, 384)
TOKENS_PER_BATCH = 8192
SHORTEST, LONGEST = 160, 400  # context lengths trained
TEXT_WEIGHT = 0.1  # the filler's own next-token loss, next to the answer's


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE on the filler corpus and the passkey sentences; digits split one by one."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = (" ".join(paragraph(i)) for i in range(CORPUS_PARAGRAPHS))
    bpe.train_from_iterator([*corpus, INTRO, QUESTION, ANSWER_LEAD, needle("0123456789")], trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bpe.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def context_at(step: int, steps: int, rng: random.Random) -> int:
    """Curriculum: short prompts first (cheap, and retrieval is learned there), the full range from 60% on.

    The shortest still has filler around the needle: with none, the key sits at a fixed offset and the
    model learns that offset instead of looking for the key, and never learns the task."""
    reach = min(1.0, step / (0.6 * steps))
    longest = int(SHORTEST + (LONGEST - SHORTEST) * reach)
    return rng.randint(SHORTEST, max(SHORTEST, longest))


def training_batch(tokenizer: Any, step: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of one context length with " <key>." appended; per-position loss weights (answer 1, text less)."""
    prompts = build_prompts(
        tokenizer, PASSKEY, max(1, TOKENS_PER_BATCH // context), context, TRAIN_SEED_BASE + step, TRAIN_SPEC
    )
    rows, weights = [], []
    for prompt in prompts:
        answer = tokenizer(f" {prompt.answer}.", add_special_tokens=False)["input_ids"]
        rows.append(list(prompt.ids) + answer)
        # weight[t] is the loss on predicting token t + 1
        weights.append([TEXT_WEIGHT / context] * (context - 1) + [1.0 / len(answer)] * len(answer))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    weight = torch.zeros(len(rows), width - 1)
    for r, (row, w) in enumerate(zip(rows, weights, strict=True)):
        ids[r, : len(row)] = torch.tensor(row)
        weight[r, : len(w)] = torch.tensor(w)
    return ids, weight


def train(model: LlamaForCausalLM, tokenizer: Any, steps: int, minutes: float, seed: int) -> int:
    """AdamW with warmup and cosine decay; returns the steps taken (fewer when `minutes` runs out)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    rng = random.Random(f"contexts:{seed}")
    started = time.monotonic()
    model.train()
    for step in range(steps):
        if time.monotonic() - started > minutes * 60:
            print(f"time budget of {minutes} min spent after {step} of {steps} steps")
            return step
        ids, weight = training_batch(tokenizer, step, context_at(step, steps, rng))
        logits = model(input_ids=ids).logits[:, :-1].float()
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (losses * weight).sum() / ids.shape[0]
        answer_loss = (losses * (weight > TEXT_WEIGHT / SHORTEST)).sum() / (weight > TEXT_WEIGHT / SHORTEST).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0 or step == steps - 1:
            spent = time.monotonic() - started
            print(
                f"step {step:4d} ctx {ids.shape[1]:4d} loss {loss.item():.3f}",
                f"answer {answer_loss.item():.3f} {spent:6.1f}s",
            )
    return steps


CacheFactory = Callable[[LlamaConfig], Any]


def dynamic(config: LlamaConfig) -> DynamicCache:
    return DynamicCache()


def quantized(backend: str, nbits: int, **settings: int) -> CacheFactory:
    """A Transformers `QuantizedCache`; `settings` are its `residual_length` / `q_group_size`."""
    return lambda config: QuantizedCache(backend, config, nbits=nbits, **settings)


@torch.no_grad()
def passkey_accuracy(
    model: LlamaForCausalLM,
    tokenizer: Any,
    context: int,
    count: int = 16,
    seed: int = EVAL_SEED,
    cache: CacheFactory = dynamic,
    batch: int = 8,
) -> float:
    """Share of `count` passkey prompts whose greedy answer is the key (kvsweep's own verdict)."""
    model.eval()
    prompts = build_prompts(tokenizer, PASSKEY, count, context, seed, EVAL_SPEC)
    correct = 0
    for start in range(0, count, batch):
        rows = prompts[start : start + batch]
        correct += sum(
            answer_correct(p, text) for p, text in zip(rows, greedy_answers(model, tokenizer, rows, cache), strict=True)
        )
    return correct / count


def greedy_answers(model: LlamaForCausalLM, tokenizer: Any, prompts: list[Prompt], cache: CacheFactory) -> list[str]:
    ids = torch.tensor([p.ids for p in prompts])
    new = max(len(p.answer or "") for p in prompts) + 2
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        past_key_values=cache(model.config),
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)


CACHE_SETTINGS: dict[str, CacheFactory] = {
    "dynamic": dynamic,
    **{f"quanto-int{n}": quantized("quanto", n) for n in (4, 2)},
    **{f"quanto-int{n} residual 16": quantized("quanto", n, residual_length=16) for n in (4, 2)},
    **{f"hqq-int{n}": quantized("hqq", n) for n in (8, 4, 2, 1)},
    **{f"hqq-int{n} residual 16": quantized("hqq", n, residual_length=16) for n in (8, 4, 2, 1)},
    **{f"hqq-int{n} residual 16 group 32": quantized("hqq", n, residual_length=16, q_group_size=32) for n in (4, 2)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE)
    parser.add_argument("--minutes", type=float, default=8.0, help="wall-time cap on training")
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--caches", action="store_true", help="also print accuracy at 384 under each quantized cache")
    args = parser.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    started = time.monotonic()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    taken = train(model, tokenizer, args.steps, args.minutes, args.seed)
    print(f"trained {taken} steps in {time.monotonic() - started:.0f}s")
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    for context in EVAL_CONTEXTS:
        print(f"passkey accuracy at {context}: {passkey_accuracy(model, tokenizer, context):.3f}")
    if args.caches:
        for name, cache in CACHE_SETTINGS.items():
            print(f"{name:34s} {passkey_accuracy(model, tokenizer, 384, cache=cache):.3f}")


if __name__ == "__main__":
    main()
