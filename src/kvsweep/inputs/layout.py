"""Token layout of a text prompt: the model's frame around a body cut or filled to an exact length.

A cell's context length is a token count, so every prompt is built in tokens, from pieces each
tokenised once: the frame (the chat template's head and tail when the tokenizer has one and it is
wanted, else the tokenizer's own leading special tokens), then the body. Tokenising pieces apart
can differ from tokenising their joined text by a token at a seam; the model reads ordinary text
either way, and the length comes out exact, which is what a cell's shape needs.
"""

from dataclasses import dataclass
from typing import Any

from kvsweep.inputs.filler import PARAGRAPHS, paragraph

SENTINEL = "\u2063KVSWEEP-BODY\u2063"  # stands in for the body while the chat template is rendered


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
    """The filler in one tokenizer's tokens, sentence by sentence, tokenised a paragraph at a time as needed.

    Each sentence is tokenised with what goes before it (a space, or a blank line where a paragraph
    starts), so the places where one sentence ends and the next begins are known in tokens: a needle
    goes there, never into the middle of a sentence."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.encoded: dict[int, list[list[int]]] = {}

    def take(self, start: int, count: int) -> list[int]:
        """`count` tokens of paragraphs from the `start`-th on, each after a blank line."""
        return self.sentences(start, count)[0]

    def sentences(self, start: int, count: int) -> tuple[list[int], list[int]]:
        """`count` tokens from the `start`-th paragraph on, and the offsets where a whole sentence starts in
        them (0 included: a needle may go first). The last sentence is cut to fit: the offset after it is
        listed only when it ends exactly at `count`, so a needle never follows a sentence cut short."""
        out: list[int] = []
        starts = [0]
        index = start % PARAGRAPHS
        while len(out) < count:
            for sentence in self._paragraph(index):
                out += sentence
                if len(out) > count:
                    break
                starts.append(len(out))
            index = (index + 1) % PARAGRAPHS
        return out[:count], [s for s in starts if s <= count]

    def _paragraph(self, index: int) -> list[list[int]]:
        if index not in self.encoded:
            sentences = paragraph(index)
            texts = ["\n\n" + sentences[0], *(" " + s for s in sentences[1:])]
            self.encoded[index] = [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return self.encoded[index]
