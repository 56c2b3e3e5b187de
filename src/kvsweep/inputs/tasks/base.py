"""The shape every task of the suite has, and the prompt layout they share.

A task prompt is the frame's head (a chat template's user header, or a BOS), the task's intro, its body, its
question, the frame's tail (the assistant header) and the answer's lead, which opens the reply so a small model
answers instead of deciding what to say. The body takes exactly what the other pieces leave of the context: a
haystack with needles between its sentences, or a list of words. A task is scored as RULER scores it: each
expected value counts as found when it occurs in the answer (case folded); the trial is correct when every one
is found, and the share found is its partial credit.
"""

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from kvsweep.inputs.passkey import Frame, encode, frame
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.tasks.haystack import Haystacks, insert

SEPARATOR = "\n\n"
DRAWS, SPARE = 16, 16  # layouts the shortest context is worked out from, and tokens to spare beyond the longest
MIN_HAYSTACK = 64  # tokens of haystack a needle task has at its shortest context: less is no search
ANSWER_ROOM = 12  # new tokens beyond the expected values' own: separators, a chat model's few words before them


class TaskKit:
    """One cell's tokenizer with what every task prompt shares: the frame, the haystacks, texts encoded once."""

    def __init__(self, tokenizer: Any, chat_template: bool) -> None:
        self.tokenizer = tokenizer
        self.frame: Frame = frame(tokenizer, chat_template)
        self.haystacks = Haystacks(tokenizer)
        self._encoded: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        if text not in self._encoded:
            self._encoded[text] = encode(self.tokenizer, text)
        return self._encoded[text]

    def lead(self, text: str) -> list[int]:
        """The answer's lead: the reply's first words under a chat template, else the question's next sentence."""
        return self.encode(text if self.frame.tail else " " + text)


@dataclass(frozen=True)
class Body:
    tokens: list[int]
    values: tuple[str, ...]  # what the answer must contain
    depth: float | None = None  # where the needle asked for sits, as a share of the body


@dataclass(frozen=True)
class Layout:
    """One trial's pieces: the fixed ones, and the body made to measure for the tokens they leave."""

    intro: list[int]
    question: list[int]
    lead: list[int]
    body: Callable[[int], Body]  # tokens it must take -> the body
    least_body: int  # the fewest tokens a body of this trial can take (its needles; a list's shortest)

    def fixed(self, framing: Frame) -> int:
        return len(framing) + len(self.intro) + len(self.question) + len(self.lead)


class Task(ABC):
    """A task of the suite: its trials' prompts, how long an answer may be, how an answer is scored."""

    name: ClassVar[str]
    title: ClassVar[str]  # as the report names it: 'multi-key NIAH'

    @abstractmethod
    def prompt(self, kit: TaskKit, index: int, context: int, seed: int, depths: tuple[float, ...]) -> Prompt:
        """The `index`-th trial at this context length, exactly `context` tokens, seeded."""

    @abstractmethod
    def minimum_context(self, kit: TaskKit) -> int:
        """The fewest tokens its trials fit in."""

    def answer_budget(self, kit: TaskKit, prompt: Prompt) -> int:
        """New tokens a trial generates: what its expected values take, and room around them."""
        return len(kit.encode(" " + ", ".join(prompt.values))) + ANSWER_ROOM

    def score(self, prompt: Prompt, text: str) -> list[bool]:
        """Which expected values the answer has (RULER's string match)."""
        return found(prompt.values, text)


class LaidOutTask(Task):
    """A task whose trial is a `Layout`: fixed pieces, and a body made to measure."""

    haystack: ClassVar[str] = ""  # the haystack its body is cut from ('' for a list task)
    margin: ClassVar[int] = MIN_HAYSTACK + SPARE  # tokens its shortest context keeps beyond a layout's least

    @abstractmethod
    def layout(self, kit: TaskKit, rng: random.Random, depth: float) -> Layout:
        """The pieces of one trial; `depth` is where the needle asked for goes (needle tasks)."""

    def prompt(self, kit: TaskKit, index: int, context: int, seed: int, depths: tuple[float, ...]) -> Prompt:
        rng = random.Random(f"{self.name}:{seed}:{context}:{index}")
        layout = self.layout(kit, rng, depths[index % len(depths)])
        budget = context - layout.fixed(kit.frame)
        if budget < layout.least_body:
            raise ValueError(f"{self.name} needs {layout.fixed(kit.frame) + layout.least_body} tokens, not {context}")
        body = layout.body(budget)
        if len(body.tokens) != budget:
            raise AssertionError(f"{self.name}: a body of {len(body.tokens)} tokens for {budget}")
        ids = (*kit.frame.head, *layout.intro, *body.tokens, *layout.question, *kit.frame.tail, *layout.lead)
        return Prompt(ids, ", ".join(body.values), body.depth, self.name, body.values)

    def minimum_context(self, kit: TaskKit) -> int:
        """The largest of `DRAWS` seeded layouts' least lengths (keys and names differ in tokens), with a haystack
        of `MIN_HAYSTACK` tokens at least (less is no search) and room to spare for a longer draw."""
        rng = random.Random(f"{self.name}:minimum")
        layouts = [self.layout(kit, rng, 0.5) for _ in range(DRAWS)]
        return max(layout.fixed(kit.frame) + layout.least_body for layout in layouts) + self.margin


def found(values: tuple[str, ...], text: str) -> list[bool]:
    """RULER's string match: each expected value is found when it occurs in the answer, case folded."""
    folded = text.casefold()
    return [value.casefold() in folded for value in values]


def needle_body(
    kit: TaskKit,
    kind: str,
    rng: random.Random,
    needles: list[tuple[float, str]],
    values: tuple[str, ...],
    depth: float | None,
) -> tuple[Callable[[int], Body], int]:
    """A haystack body with `needles` (depth, sentence) between its sentences; the fewest tokens it takes (the
    needles alone)."""
    pieces = [(at, kit.encode(" " + sentence)) for at, sentence in needles]
    needed = sum(len(tokens) for _, tokens in pieces)
    haystack_rng = random.Random(rng.random())

    def body(budget: int) -> Body:
        haystack, starts = kit.haystacks.sentences(kind, budget - needed, haystack_rng)
        return Body(insert(haystack, starts, pieces), values, depth)

    return body, needed
