"""Token layout of a text prompt: the model's frame around a body cut or filled to an exact length.

A cell's context length is a token count, so every prompt is built in tokens, from pieces each
tokenised once: the frame (the chat template's head and tail when the tokenizer has one and it is
wanted, else the tokenizer's own leading special tokens), then the body. Tokenising pieces apart
can differ from tokenising their joined text by a token at a seam; the model reads ordinary text
either way, and the length comes out exact, which is what a cell's shape needs.
"""

from dataclasses import dataclass
from typing import Any

from kvsweep.inputs.filler import filler_paragraphs

SENTINEL = "\u2063KVSWEEP-BODY\u2063"  # stands in for the body while the chat template is rendered
FILLER_BATCH = 32  # paragraphs tokenised per call


@dataclass(frozen=True)
class Frame:
    head: tuple[int, ...]
    tail: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def frame(tokenizer: Any, use_chat_template: bool, turns: tuple[dict[str, str], ...] = ()) -> Frame:
    """What surrounds the body: the earlier `turns` and the last user turn's template, or plain specials."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = [*turns, {"role": "user", "content": SENTINEL}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        head, _, tail = text.partition(SENTINEL)
        return Frame(tuple(encode(tokenizer, head)), tuple(encode(tokenizer, tail)))
    earlier = "".join(f"{turn['role']}: {turn['content']}\n\n" for turn in turns)
    return Frame(tuple(leading_specials(tokenizer) + (encode(tokenizer, earlier) if earlier else [])), ())


def leading_specials(tokenizer: Any) -> list[int]:
    """The special tokens the tokenizer puts before a text (a BOS, usually); none that it appends (an EOS
    after the prompt would tell the model the text is over)."""
    plain = encode(tokenizer, "a")
    marked = list(tokenizer("a")["input_ids"])
    for start in range(len(marked) - len(plain) + 1):
        if marked[start : start + len(plain)] == plain:
            return marked[:start]
    return []


def cut_middle(tokens: list[int], budget: int) -> list[int]:
    """The first and last halves of `budget`: a long document keeps its opening and what leads to the question."""
    if len(tokens) <= budget:
        return tokens
    head = budget // 2
    return tokens[:head] + tokens[len(tokens) - (budget - head) :]


class FillerStream:
    """The filler corpus in one tokenizer's tokens, tokenised a batch of paragraphs at a time as needed."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.paragraphs = filler_paragraphs()
        self.encoded: dict[int, list[int]] = {}

    def take(self, start: int, count: int) -> list[int]:
        """`count` tokens of paragraphs from the `start`-th on (wrapping around the corpus), each after a blank line."""
        out: list[int] = []
        index = start % len(self.paragraphs)
        while len(out) < count:
            out += self._paragraph(index)
            index = (index + 1) % len(self.paragraphs)
        return out[:count]

    def _paragraph(self, index: int) -> list[int]:
        if index not in self.encoded:
            batch = range(index, min(index + FILLER_BATCH, len(self.paragraphs)))
            texts = ["\n\n" + self.paragraphs[i] for i in batch]
            for i, ids in zip(batch, self.tokenizer(texts, add_special_tokens=False)["input_ids"], strict=True):
                self.encoded[i] = list(ids)
        return self.encoded[index]
