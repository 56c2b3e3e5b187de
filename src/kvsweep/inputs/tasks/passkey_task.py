"""The passkey task as a member of the suite: one key, said twice, in varied prose (`inputs/passkey.py`).

Its prompt keeps the layout it always had, so a passkey cell's prompts are those of earlier sweeps; it is scored as
always too: right when the first number of the answer is the key.
"""

import random

from kvsweep.inputs.filler import PARAGRAPHS
from kvsweep.inputs.passkey import (
    ANSWER_LEAD,
    INTRO,
    KEY_DIGITS,
    QUESTION,
    answer_tokens,
    key_found,
    needle,
    random_key,
)
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.spec import PASSKEY
from kvsweep.inputs.tasks.base import SEPARATOR, Task, TaskKit


class Passkey(Task):
    name, title = PASSKEY, "passkey"

    def _fixed(self, kit: TaskKit, key: str) -> int:
        pieces = (
            kit.encode(INTRO),
            kit.encode(" " + needle(key)),
            kit.encode(SEPARATOR + QUESTION),
            kit.lead(ANSWER_LEAD),
        )
        return len(kit.frame) + sum(len(piece) for piece in pieces)

    def prompt(self, kit: TaskKit, index: int, context: int, seed: int, depths: tuple[float, ...]) -> Prompt:
        rng = random.Random(f"passkey:{seed}:{context}:{index}")
        key = random_key(rng)
        depth = depths[index % len(depths)]
        budget = context - self._fixed(kit, key)
        filler, sentence_starts = kit.haystacks.prose.sentences(rng.randrange(PARAGRAPHS), budget)
        at = min(sentence_starts, key=lambda start: abs(start - depth * budget))  # between sentences
        hidden = kit.encode(" " + needle(key))  # the next sentence brings its own space
        body = kit.encode(INTRO) + filler[:at] + hidden + filler[at:] + kit.encode(SEPARATOR + QUESTION)
        ids = (*kit.frame.head, *body, *kit.frame.tail, *kit.lead(ANSWER_LEAD))
        return Prompt(ids, key, depth, PASSKEY, (key,))

    def minimum_context(self, kit: TaskKit) -> int:
        return self._fixed(kit, "9" * KEY_DIGITS[1])

    def answer_budget(self, kit: TaskKit, prompt: Prompt) -> int:
        return answer_tokens(prompt.answer or "")

    def score(self, prompt: Prompt, text: str) -> list[bool]:
        return [key_found(text, prompt.answer or "")]
