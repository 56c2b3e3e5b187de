"""After the timed calls: does the cache still answer the task? Each cell answers its own prompts.

Every strategy of a (model, batch, context) pair answers the same prompts, so the selection can set
a strategy's accuracy against dynamic's own cell. Trials run in whole batches of the cell's shape,
greedy, each only as long as its answer needs (the key's digits, or the expected answer, and some
room for a chat model's preamble); the prompts are in `Feed.prompts`.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from kvsweep.caches import CacheStrategy
from kvsweep.cell.call_inputs import Feed
from kvsweep.cell.generate_session import GenerateSession
from kvsweep.inputs.passkey import answer_correct, answer_tokens
from kvsweep.inputs.prompts import Prompt
from kvsweep.inputs.spec import PASSKEY
from kvsweep.measure.statistics import exact_interval
from kvsweep.names import Metric, ci_high, ci_low, passkey_depth_metric

ANSWER_ROOM = 8  # tokens a file prompt's answer may take beyond its own length (a chat model's preamble)


def answer_budget(feed: Feed) -> int:
    """New tokens each trial generates: what the longest expected answer needs."""
    longest = 1
    for prompt in feed.prompts:
        if prompt.answer is None:
            continue
        if prompt.kind == PASSKEY:
            longest = max(longest, answer_tokens(prompt.answer))
        else:
            tokens = len(feed.tokenizer(prompt.answer, add_special_tokens=False)["input_ids"])
            longest = max(longest, tokens + ANSWER_ROOM)
    return longest


@dataclass(frozen=True)
class TaskOutcome:
    metrics: dict[str, float] = field(default_factory=dict)  # accuracy, its interval, per depth; empty: no task
    trials: tuple[dict[str, Any], ...] = ()  # every prompt that has an answer: what it asked, what came back


def task_accuracy(session: GenerateSession, strategy: CacheStrategy, feed: Feed, batch: int, seed: int) -> TaskOutcome:
    """Accuracy over every prompt that has an answer, with its exact 95% interval; passkey also per depth.

    Every such prompt is also kept as a trial (`task.jsonl`): its index and the sweep's seed rebuild it."""
    checked = [p.answer is not None for p in feed.prompts]
    if not any(checked):
        return TaskOutcome()
    budget = answer_budget(feed)
    correct: list[bool] = []
    texts: list[str] = []
    for start in range(0, len(feed.prompts), batch):
        rows = feed.prompts[start : start + batch]
        ids = torch.tensor([p.ids for p in rows], dtype=torch.long)
        tokens = session.answer(strategy, ids, budget)
        answers = feed.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        texts += answers
        correct += [p.answer is not None and answer_correct(p, text) for p, text in zip(rows, answers, strict=True)]
    answered = [(p, ok) for p, ok, has in zip(feed.prompts, correct, checked, strict=True) if has]
    trials = tuple(
        trial_record(index, seed, prompt, text, ok)
        for index, (prompt, text, ok) in enumerate(zip(feed.prompts, texts, correct, strict=True))
        if prompt.answer is not None
    )
    kind = answered[0][0].kind
    metric = Metric.PASSKEY_ACCURACY if kind == PASSKEY else Metric.ANSWER_ACCURACY
    metrics = share_metrics(metric, [ok for _, ok in answered])
    metrics[Metric.TASK_TRIALS] = float(len(answered))
    if kind == PASSKEY:
        by_depth: dict[float, list[bool]] = defaultdict(list)
        for prompt, ok in answered:
            by_depth[float(prompt.depth or 0.0)].append(ok)
        for depth, outcomes in sorted(by_depth.items()):
            metrics[passkey_depth_metric(depth)] = sum(outcomes) / len(outcomes)
    return TaskOutcome(metrics, trials)


def trial_record(index: int, seed: int, prompt: Prompt, text: str, correct: bool) -> dict[str, Any]:
    """One line of `task.jsonl`: the prompt's index and seed (with the cell's context and inputs settings they
    rebuild it), where the needle sat, what was expected, the greedy answer as decoded, the verdict."""
    return {
        "prompt_index": index,
        "seed": seed,
        "kind": prompt.kind,
        "depth": prompt.depth,
        "expected": prompt.answer,
        "answer": text,
        "correct": correct,
    }


def share_metrics(metric: str, outcomes: list[bool]) -> dict[str, float]:
    """The share of successes and its Clopper-Pearson 95% interval."""
    low, high = exact_interval(sum(outcomes), len(outcomes))
    return {metric: sum(outcomes) / len(outcomes), ci_low(metric): low, ci_high(metric): high}
