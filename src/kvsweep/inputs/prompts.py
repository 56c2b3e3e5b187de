"""A cell's text prompts, exactly `context_length` tokens each: the task suite's (`tasks/`) or the user's own.

Prompt `i` depends only on the sweep's seed, the context length, `i` and the inputs settings, so every strategy
of a (model, batch, context) pair gets the same prompts, and each batch row its own. A needle goes at the
sentence boundary nearest its depth (`InputSpec.depths`), never spliced into a sentence. A file's record is split
at its last blank line into body and question; a longer body is cut in the middle (its start and end stay), a
shorter prompt filled in front; a record used a second time keeps no answer, so it is not counted twice.
"""

import hashlib
import json
import random
from typing import Any

from kvsweep.inputs.filler import PARAGRAPHS
from kvsweep.inputs.passkey import FillerStream, Frame, cut_middle, encode, frame
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.spec import FILE, InputSpec, suite_of
from kvsweep.inputs.tasks.suite import minimum_contexts, task_prompts

SEPARATOR = "\n\n"


def build_prompts(
    tokenizer: Any, kind: str, count: int, context_length: int, seed: int, spec: InputSpec
) -> list[Prompt]:
    """The first `count` prompts of this context length (of each task of a suite), each `context_length` tokens."""
    stream = FillerStream(tokenizer)
    tasks = suite_of(kind, spec)
    if tasks:
        return task_prompts(tokenizer, tasks, count, context_length, seed, spec.depths, spec.chat_template)
    if kind == FILE:
        return [_file_prompt(tokenizer, stream, spec, i, context_length, seed) for i in range(count)]
    raise ValueError(f"no text prompts for inputs {kind!r}")


def whole_prompt(tokenizer: Any, record: dict[str, Any], use_chat_template: bool, answered: bool = True) -> Prompt:
    """A file's record as written, framed as a cell frames it, neither cut nor filled: a request of a prompts-file
    workload, whose length is the prompt's own. `answered=False` drops its answer (a record used a second time)."""
    turns, text = _turns(record)
    framing = frame(tokenizer, use_chat_template, turns)
    answer = record.get("answer") if answered else None
    return Prompt(_framed(framing, encode(tokenizer, text)), answer, None, FILE)


def minimum_context(tokenizer: Any, kind: str, spec: InputSpec) -> int:
    """The fewest tokens a prompt of this kind fits in: its frame and everything that is never cut (of a suite,
    its longest task's)."""
    tasks = suite_of(kind, spec)
    if tasks:
        return max(minimum_contexts(tokenizer, tasks, spec.chat_template).values())
    shortest = 0
    for record in spec.records:
        turns, text = _turns(record)
        question = encode(tokenizer, _split_question(text)[1]) if SEPARATOR in text else []
        shortest = max(shortest, len(frame(tokenizer, spec.chat_template, turns)) + len(question) + 1)
    return shortest


def prompts_sha256(prompts: list[Prompt]) -> str:
    """What the `inputs_sha256` param says: every prompt's tokens and expected answer."""
    payload = json.dumps([[list(p.ids), p.answer] for p in prompts], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _file_prompt(tokenizer: Any, stream: FillerStream, spec: InputSpec, index: int, context: int, seed: int) -> Prompt:
    records = spec.records
    record = records[index % len(records)]
    turns, text = _turns(record)
    framing = frame(tokenizer, spec.chat_template, turns)
    body_text, question_text = _split_question(text)
    question = encode(tokenizer, question_text)
    body = encode(tokenizer, body_text)
    budget = context - len(framing) - len(question)
    if len(body) > budget:
        body = cut_middle(body, budget)
    elif len(body) < budget:
        body = _fill(tokenizer, stream, spec, index, budget - len(body), seed) + body
    answer = record.get("answer") if index < len(records) else None
    return Prompt(_framed(framing, body + question), answer, None, FILE)


def _fill(tokenizer: Any, stream: FillerStream, spec: InputSpec, index: int, count: int, seed: int) -> list[int]:
    """`count` tokens to go before a short prompt: the file's further prompts, then filler, then a blank line."""
    separator = encode(tokenizer, SEPARATOR)
    wanted = count - len(separator)
    if wanted <= 0:
        return stream.take(0, count)
    fill: list[int] = []
    records = spec.records
    for step in range(1, len(records)):
        if len(fill) >= wanted:
            break
        fill += encode(tokenizer, _turns(records[(index + step) % len(records)])[1] + SEPARATOR)
    if len(fill) < wanted:
        start = random.Random(f"fill:{seed}:{index}").randrange(PARAGRAPHS)
        fill += stream.take(start, wanted - len(fill))
    return fill[:wanted] + separator


def _turns(record: dict[str, Any]) -> tuple[tuple[dict[str, str], ...], str]:
    """The turns before the one answered, and the text of the one answered (a plain prompt is one user turn)."""
    if "messages" in record:
        messages = record["messages"]
        return tuple({"role": m["role"], "content": m["content"]} for m in messages[:-1]), messages[-1]["content"]
    return (), record["prompt"]


def _split_question(text: str) -> tuple[str, str]:
    """Body and question: the question is what follows the last blank line (it keeps that blank line)."""
    body, separator, question = text.rpartition(SEPARATOR)
    return (body, separator + question) if separator else (text, "")


def _framed(framing: Frame, body: list[int]) -> tuple[int, ...]:
    return (*framing.head, *body, *framing.tail)
