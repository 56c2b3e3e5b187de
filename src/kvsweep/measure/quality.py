"""How far a cache strategy moves the model's output from the dynamic-cache baseline.

Token agreement compares the free-running greedy outputs; it says *whether* outputs change but
one early flip makes every later position differ. The KL divergence is measured teacher-forced:
the candidate cache is fed the baseline's own tokens, so at every step both distributions are
conditioned on the same prefix and the divergence is the cache's doing alone.
"""

from collections.abc import Callable

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from kvsweep.names import Metric

# Full-vocabulary log-probabilities for every step are kept on the host for the comparison;
# beyond this many bytes only the batch's first row is compared (a 128k vocabulary x 256 steps x
# batch 16 would otherwise hold 2 GiB).
MAX_REFERENCE_BYTES = 1 << 30


class StepLogProbs(LogitsProcessor):
    """Keeps each step's next-token log-probabilities (float32, on the host)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.steps.append(torch.log_softmax(scores[: self.rows].float(), dim=-1).cpu())
        return scores


class ForceTokens(LogitsProcessor):
    """Makes greedy decoding pick the given tokens, step by step (teacher forcing inside `generate`)."""

    def __init__(self, tokens: torch.Tensor, prompt_length: int) -> None:
        self.tokens = tokens
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_length
        wanted = self.tokens[:, step].to(scores.device)
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, wanted.unsqueeze(1), 0.0)


def reference_rows(batch: int, steps: int, vocab: int) -> int:
    """How many batch rows the reference keeps within MAX_REFERENCE_BYTES (at least one)."""
    per_row = steps * vocab * 4
    return max(1, min(batch, MAX_REFERENCE_BYTES // max(per_row, 1)))


Generate = Callable[[LogitsProcessorList], torch.Tensor]
"""Runs one greedy `generate` with extra logits processors and returns the new tokens."""


def record_reference(generate: Generate, rows: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The baseline's new tokens and per-step log-probabilities."""
    recorder = StepLogProbs(rows)
    tokens = generate(LogitsProcessorList([recorder]))
    return tokens, recorder.steps


def teacher_forced_kl(
    generate: Generate, reference_tokens: torch.Tensor, reference: list[torch.Tensor], prompt_length: int
) -> dict[str, float]:
    """Mean and max over steps of KL(baseline || candidate), in nats, on the baseline's own prefix."""
    recorder = StepLogProbs(reference[0].shape[0])
    generate(LogitsProcessorList([recorder, ForceTokens(reference_tokens, prompt_length)]))
    per_step = [kl_divergence(p, q) for p, q in zip(reference, recorder.steps, strict=True)]
    return {Metric.KL_DIVERGENCE: float(torch.stack(per_step).mean()), Metric.KL_DIVERGENCE_MAX: float(max(per_step))}


def kl_divergence(reference_log_probs: torch.Tensor, candidate_log_probs: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) per row from log-probabilities, averaged over rows; 0 * log 0 counts as 0."""
    p = reference_log_probs.exp()
    terms = torch.where(p > 0, p * (reference_log_probs - candidate_log_probs), torch.zeros_like(p))
    return terms.sum(dim=-1).clamp_min(0.0).mean()


def token_agreement(tokens: torch.Tensor, baseline: torch.Tensor) -> dict[str, float]:
    """Share of generated positions equal to the baseline, and the first position that differs."""
    equal = tokens == baseline
    per_position = equal.all(dim=0)
    diverged = (~per_position).nonzero()
    first = int(diverged[0, 0]) if diverged.numel() else tokens.shape[1]
    return {Metric.TOKEN_AGREEMENT: float(equal.float().mean()), Metric.FIRST_DIVERGENCE: float(first)}
