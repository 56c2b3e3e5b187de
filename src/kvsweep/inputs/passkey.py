"""The built-in long-context task: a random pass key hidden at a depth in filler text, asked for at the end.

The prompt's words are fixed here, and its tokens laid out (`FillerStream`, `frame`) so the key sits at the asked
depth of the exact context length. A passkey answer is right when its first number is the key ("The pass key is
58213." counts). A prompts file's answer is an exact match after normalising, as reading-comprehension benchmarks
score it ("Paris." or " paris" for "Paris", not "Paris, France"), on the first non-empty line's first sentence, so
what a model says after its answer does not turn it wrong.
"""

import random
import re
import string
import unicodedata
from dataclasses import dataclass
from typing import Any

from kvsweep.inputs.filler import PARAGRAPHS, paragraph

INTRO = (
    "There is a pass key hidden inside a lot of irrelevant text. Find it and remember it. "
    "You will be asked for the pass key at the end."
)
QUESTION = "What is the pass key?"
# How the answer starts: the model's reply opens with it (after a chat template's assistant header, else
# after the question), so a model continues with the key instead of deciding what a "pass key" is.
ANSWER_LEAD = "The pass key is"
KEY_DIGITS = (5, 7)  # shortest and longest key
FIRST_NUMBER = re.compile(r"\d+")


def needle(key: str) -> str:
    """The sentence that hides the key (said twice, the way the passkey task has always stated it)."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def random_key(rng: random.Random) -> str:
    """5 to 7 digits, never starting with 0 (a leading zero would read as a shorter number)."""
    digits = rng.randint(*KEY_DIGITS)
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def key_found(answer: str, key: str) -> bool:
    """Whether the first number in the model's answer is the key."""
    match = FIRST_NUMBER.search(answer)
    return match is not None and match.group() == key


def answer_tokens(key: str) -> int:
    """New tokens a trial generates: room for the key digit by digit, and for a chat model's preamble."""
    return len(key) + 12


SENTENCE_END = re.compile(r"(?<=[.!?])\s")
PUNCTUATION = str.maketrans("", "", string.punctuation + "“”‘’«»…")


def normalise(text: str) -> str:
    """NFKC, case-folded, punctuation dropped, spaces collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold().translate(PUNCTUATION)
    return " ".join(folded.split())


def first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def exact_match(answer: str, expected: str) -> bool:
    """The answer's first non-empty line, or that line's first sentence, normalised, is the expected answer."""
    line = first_line(answer)
    return normalise(expected) in (normalise(line), normalise(SENTENCE_END.split(line.strip(), maxsplit=1)[0]))


TOKENS_PER_PARAGRAPH = (
    80  # about what a filler paragraph takes (87 in SmolLM2's tokenizer): prefetch no more than needed
)
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
        self._prefetch(index, count // TOKENS_PER_PARAGRAPH + 1)
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
            self._prefetch(index, 1)
        return self.encoded[index]

    def _prefetch(self, start: int, count: int) -> None:
        """Tokenise the `count` paragraphs from `start` on in one call (a 128k-token haystack is ~1,500 of them)."""
        indices = [i % PARAGRAPHS for i in range(start, start + count) if i % PARAGRAPHS not in self.encoded]
        texts, owners = [], []
        for index in indices:
            sentences = paragraph(index)
            texts += ["\n\n" + sentences[0], *(" " + s for s in sentences[1:])]
            owners += [index] * len(sentences)
        if not texts:
            return
        for index, ids in zip(owners, self.tokenizer(texts, add_special_tokens=False)["input_ids"], strict=True):
            self.encoded.setdefault(index, []).append(list(ids))
