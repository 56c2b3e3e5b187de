"""After the measurement: does this cache give the answers the dynamic cache gives, on the same inputs?"""

from typing import Any

import torch

from kvsweep.caches import BASELINE, CacheStrategy, get_strategy
from kvsweep.cell.generate_session import GenerateSession
from kvsweep.cell.oom import out_of_memory
from kvsweep.measure.quality import record_reference, reference_rows, teacher_forced_kl
from kvsweep.measure.summary import token_agreement
from kvsweep.names import ResultTag
from kvsweep.results import CellResult


def quality_or_nothing(
    session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int, result: CellResult
) -> dict[str, float]:
    """The quality check runs after the measurement: if its extra calls do not fit (a dynamic baseline
    where only a lean cache fits is the very case), the cell keeps its numbers and says why."""
    try:
        return _quality(session, strategy, tokens, vocab, result.environment)
    except Exception as exc:
        if not out_of_memory(exc, "cuda" if session.cuda else "cpu"):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        result.tags[ResultTag.QUALITY] = f"not measured: the quality check ran out of memory ({type(exc).__name__})"
        return {}


def _quality(
    session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int, environment: dict[str, Any]
) -> dict[str, float]:
    """Agreement with the dynamic-cache answer on the same model and inputs, and the teacher-forced KL.

    Both compare the strategy as configured (a compiled cell's compiled forward): the question is what
    serving with this cache would produce. The dynamic baseline always runs eager.
    """
    if strategy.name == BASELINE:
        return token_agreement(tokens, tokens)
    dynamic = get_strategy(BASELINE)
    rows = reference_rows(tokens.shape[0], tokens.shape[1], vocab)
    with session.eager():
        baseline, reference = record_reference(lambda p: session.generate_with(dynamic, p), rows)
    prompt_length = session.inputs.shape[1]
    compiled_before = session.compiled_calls
    kl = teacher_forced_kl(lambda p: session.generate_with(strategy, p), baseline, reference, prompt_length)
    compiled = session.compiled_calls > compiled_before or (session.cell.compile and session.cuda)
    environment["quality_forward"] = "compiled" if compiled else "eager"
    return {**token_agreement(tokens, baseline), **kl}
