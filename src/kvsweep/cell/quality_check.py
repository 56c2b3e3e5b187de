"""After the measurement: does this cache give the answers the dynamic cache gives, on the same inputs,
and (text-fed cells) does it still answer the task?"""

from dataclasses import dataclass, field
from typing import Any

import torch

from kvsweep.caches import BASELINE, CacheStrategy, get_strategy
from kvsweep.cell.call_inputs import Feed
from kvsweep.cell.generate_session import GenerateSession
from kvsweep.cell.process import out_of_memory
from kvsweep.cell.task_check import TaskOutcome, task_accuracy
from kvsweep.measure.quality import record_reference, reference_rows, teacher_forced_kl, token_agreement


@dataclass(frozen=True)
class QualityCheck:
    metrics: dict[str, float] = field(default_factory=dict)  # task accuracy, agreement, KL; empty: not measured
    forward: str = ""  # the forward the KL used: compiled | eager ("" when nothing was compared)
    not_measured: str = ""  # why there are no metrics (the `kvsweep.quality` tag)
    trials: tuple[dict[str, Any], ...] = ()  # every task trial (`task.jsonl`)


def quality_or_nothing(
    session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int, feed: Feed, seed: int
) -> QualityCheck:
    """The quality check runs after the measurement: if its extra calls do not fit (a dynamic baseline
    where only a lean cache fits is the very case), the cell keeps its numbers and says why.

    The task comes first: it runs the cell's own strategy alone, so it fits wherever the timed calls
    did, and its accuracy stays when the comparison with dynamic then runs out of memory."""
    task = TaskOutcome()
    try:
        if feed.prompts:
            task = task_accuracy(session, strategy, feed, session.cell.batch_size, seed)
        check = _quality(session, strategy, tokens, vocab)
        return QualityCheck({**task.metrics, **check.metrics}, check.forward, trials=task.trials)
    except Exception as exc:
        if not out_of_memory(exc, "cuda" if session.cuda else "cpu"):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        part = "the comparison with dynamic" if task.metrics else "the quality check"
        why = f"not measured: {part} ran out of memory ({type(exc).__name__})"
        return QualityCheck(task.metrics, not_measured=why, trials=task.trials)


def _quality(session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int) -> QualityCheck:
    """Agreement with the dynamic-cache answer on the same model and inputs, and the teacher-forced KL.

    Both compare the strategy as configured (a compiled cell's compiled forward): the question is what
    serving with this cache would produce. The dynamic baseline always runs eager.
    """
    if strategy.name == BASELINE:
        return QualityCheck(token_agreement(tokens, tokens))
    dynamic = get_strategy(BASELINE)
    rows = reference_rows(tokens.shape[0], tokens.shape[1], vocab)
    with session.eager():
        baseline, reference = record_reference(lambda p: session.generate_with(dynamic, p), rows)
    prompt_length = session.inputs.shape[1]
    compiled_before = session.compiled_calls
    kl = teacher_forced_kl(lambda p: session.generate_with(strategy, p), baseline, reference, prompt_length)
    compiled = session.compiled_calls > compiled_before or (session.cell.compile and session.cuda)
    return QualityCheck({**token_agreement(tokens, baseline), **kl}, "compiled" if compiled else "eager")
