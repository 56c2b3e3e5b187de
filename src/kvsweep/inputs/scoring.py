"""Is an answer right? One verdict per expected value, by the rule of the prompt's kind.

A suite task scores as the task says (RULER's string match; the passkey's first number), a prompts file's answer
by exact match after normalising (`passkey.exact_match`). A trial is correct when every value is found; the share
found is its partial credit.
"""

from kvsweep.inputs.passkey import exact_match
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.spec import FILE
from kvsweep.inputs.tasks.suite import score


def value_hits(prompt: Prompt, text: str) -> list[bool]:
    """Which of the prompt's expected values the answer has (none when nothing is expected)."""
    if prompt.answer is None:
        return []
    if prompt.kind == FILE:
        return [exact_match(text, prompt.answer)]
    return score(prompt, text)


def answer_correct(prompt: Prompt, text: str) -> bool:
    """Every expected value is in the answer."""
    hits = value_hits(prompt, text)
    return bool(hits) and all(hits)
