"""Haystacks in one tokenizer's tokens, exactly as long as asked, and needles put between their sentences.

Two haystacks, as RULER has: `noise`, one block of plain sentences repeated ("The grass is green. ..."), and
`prose`, the varied country prose the passkey task hides its key in (`inputs/filler.py`), seeded by the paragraph it
starts from. Both are kept as token lists with the offsets where a whole sentence starts, so a needle goes between
two sentences, never into one, and the prompt is exactly the cell's context length: the haystack takes whatever
the task's fixed pieces leave, its last sentence cut to fit.
"""

import random
from collections.abc import Sequence
from typing import Any

from kvsweep.inputs.filler import PARAGRAPHS
from kvsweep.inputs.passkey import FillerStream

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = tuple(sentence + "." for sentence in NOISE.removesuffix(".").split(". "))
NOISE_HAYSTACK, PROSE_HAYSTACK = "noise", "prose"


class NoiseStream:
    """The noise block's sentences in tokens, each after a space, tokenised once and repeated."""

    def __init__(self, tokenizer: Any) -> None:
        texts = [" " + sentence for sentence in NOISE_SENTENCES]
        self.sentence_ids = [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        self.block = [token for ids in self.sentence_ids for token in ids]
        offsets, at = [], 0
        for ids in self.sentence_ids:
            offsets.append(at)
            at += len(ids)
        self.offsets = offsets

    def sentences(self, count: int) -> tuple[list[int], list[int]]:
        """`count` tokens and the offsets where a whole sentence starts (as `FillerStream.sentences`)."""
        size = len(self.block)
        tokens = (self.block * (count // size + 1))[:count]
        starts = [cycle * size + offset for cycle in range(count // size + 1) for offset in self.offsets]
        return tokens, [start for start in starts if start <= count]


class Haystacks:
    """One cell's haystacks: both kinds, tokenised lazily with the cell's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.prose = FillerStream(tokenizer)
        self._noise: NoiseStream | None = None

    def sentences(self, kind: str, count: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """`count` tokens of the `kind` haystack and its sentence starts; prose starts at a paragraph `rng` picks."""
        if kind == NOISE_HAYSTACK:
            if self._noise is None:
                self._noise = NoiseStream(self.tokenizer)
            return self._noise.sentences(count)
        return self.prose.sentences(rng.randrange(PARAGRAPHS), count)


def insert(haystack: list[int], starts: Sequence[int], needles: Sequence[tuple[float, list[int]]]) -> list[int]:
    """The haystack with each needle (depth in 0-1, tokens) at the sentence start nearest its depth.

    Needles that land on the same start keep their given order; each is placed whole."""
    length = len(haystack)
    placed = sorted(
        ((min(starts, key=lambda start: abs(start - depth * length)), order, tokens)
         for order, (depth, tokens) in enumerate(needles)),
        key=lambda item: (item[0], item[1]),
    )  # fmt: skip
    out: list[int] = []
    previous = 0
    for at, _, tokens in placed:
        out += haystack[previous:at] + tokens
        previous = at
    return out + haystack[previous:]
