"""Aggregation, RULER's two counting tasks (Hsieh et al., 2024, section 3.1): common words and frequent words.

Both bodies are lists of words as long as the context leaves, so the answer depends on every part of it.
- `cwe`: a numbered list ("1. tavomil 2. grensa ...") where ten words occur 30 times each and every other word 3
  times (RULER's counts); at contexts too short for that, the ten take a third of the list (at the shortest, half),
  each at least twice as often as any other word.
- `fwe`: a "coded text" of words separated by " .... ", with counts falling as 1/rank² (RULER's zeta distribution
  with alpha 2, as expected counts rather than a draw, so the top three never tie); the answer is the top three.
Words are pseudo-words (`vocabulary.pseudo_words`): no model knows one as commoner than another.

The list is sized from a sample's tokens per item, tokenised in one call (a 128k-token list is ~25k items), cut
after its last whole item within the budget, and topped up item by item with words seen once; the few tokens no
item fits in are newlines. The answer is read off the list as kept, and must stand apart from the next count.
"""

import random
from abc import abstractmethod
from collections import Counter

from kvsweep.inputs.tasks.base import SEPARATOR, SPARE, Body, LaidOutTask, Layout, TaskKit
from kvsweep.inputs.tasks.vocabulary import pseudo_words

COMMON, UNCOMMON, COMMON_WORDS = 30, 3, 10  # RULER's freq_cw, freq_ucw and num_cw
LEAST_COMMON = 4  # a common word's fewest occurrences at short contexts (the others' then at most half that)
TOP = 3  # fwe: the three most frequent
ZIPF_ALPHA = 2.0
SIZE_MARGIN = 0.97  # the list is drawn for this share of its budget; the rest is topped up item by item
RESERVE = 0.05  # ...from this many spare words per item drawn (seen once each)


class _ListTask(LaidOutTask):
    margin = SPARE  # the list is the haystack: its shortest is its own least
    answers: int  # how many of the most frequent words the answer names
    least_items: int  # the shortest list that keeps the answer apart

    @abstractmethod
    def draw(self, rng: random.Random, items: int) -> list[str]:
        """About `items` words in list order."""

    @abstractmethod
    def item(self, index: int, word: str) -> str:
        """The text of the list's `index`-th item (the first opens the body)."""

    def layout(self, kit: TaskKit, rng: random.Random, depth: float) -> Layout:
        question, lead = self.question()
        per_item = _tokens_per_item(kit, self)
        list_rng = random.Random(rng.random())

        def body(budget: int) -> Body:
            words = self.draw(list_rng, max(self.least_items, int(budget / per_item * SIZE_MARGIN)))
            listed = set(words)
            spare = [w for w in pseudo_words(list_rng, len(listed) + int(len(words) * RESERVE) + 8) if w not in listed]
            tokens, kept = _fit(kit, [self.item(i, w) for i, w in enumerate(words)], budget)
            words = words[:kept]
            for extra in spare:
                piece = kit.encode(self.item(len(words), extra))
                if len(tokens) + len(piece) > budget:
                    break
                tokens += piece
                words.append(extra)
            tokens += kit.encode("\n")[-1:] * (budget - len(tokens))  # one token, whatever marks a word start
            return Body(tokens, self.answer(words), None)

        least = int(per_item * self.least_items / SIZE_MARGIN) + 1
        return Layout(kit.encode(self.intro), kit.encode(SEPARATOR + question), kit.lead(lead), body, least)

    intro: str

    @abstractmethod
    def question(self) -> tuple[str, str]:
        """The question and the answer's lead."""

    def answer(self, words: list[str]) -> tuple[str, ...]:
        """The `answers` most frequent words, most frequent first; an error if the next one ties the last."""
        ranked = Counter(words).most_common(self.answers + 1)
        if len(ranked) <= self.answers or ranked[self.answers - 1][1] <= ranked[self.answers][1]:
            raise ValueError(f"{self.name}: the list's top {self.answers} do not stand apart: {ranked}")
        return tuple(word for word, _ in ranked[: self.answers])


def _tokens_per_item(kit: TaskKit, task: "_ListTask") -> float:
    """A list item's mean tokens in this tokenizer, from a fixed sample: the same for every trial."""
    sample = pseudo_words(random.Random(f"{task.name}:per-item"), PER_ITEM_SAMPLE)
    return max(1.0, sum(len(kit.encode(task.item(100 + i, word))) for i, word in enumerate(sample)) / PER_ITEM_SAMPLE)


PER_ITEM_SAMPLE = 32


def _fit(kit: TaskKit, texts: list[str], budget: int) -> tuple[list[int], int]:
    """The items' tokens from one call, cut after the last whole item within `budget`, and how many items that is."""
    encoded = kit.tokenizer(["".join(texts)], add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"][0], encoded["offset_mapping"][0]
    ends, at = [], 0
    for text in texts:
        at += len(text)
        ends.append(at)
    kept = cut = 0
    for token, (_, end) in enumerate(offsets[:budget]):
        while kept < len(ends) and ends[kept] <= end:
            kept += 1
            cut = token + 1
    return list(ids[:cut]), kept


class CommonWords(_ListTask):
    """The ten words of a numbered list that occur most often."""

    name, title = "cwe", "common words"
    answers, least_items = COMMON_WORDS, 2 * COMMON_WORDS * LEAST_COMMON
    intro = (
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often."
    )

    def draw(self, rng: random.Random, items: int) -> list[str]:
        common_count = max(LEAST_COMMON, min(COMMON, items // 3 // COMMON_WORDS))
        each = min(UNCOMMON, common_count // 2)
        uncommon = max(1, (items - COMMON_WORDS * common_count) // each)
        words = pseudo_words(rng, COMMON_WORDS + uncommon)
        listed = words[:COMMON_WORDS] * common_count + words[COMMON_WORDS:] * each
        rng.shuffle(listed)
        return listed

    def item(self, index: int, word: str) -> str:
        return f"{SEPARATOR if index == 0 else ' '}{index + 1}. {word}"

    def question(self) -> tuple[str, str]:
        return (
            f"Question: What are the {COMMON_WORDS} most common words in the above list?",
            f"Answer: The top {COMMON_WORDS} words that appear most often in the list are:",
        )


class FrequentWords(_ListTask):
    """The three most frequent words of a coded text."""

    name, title = "fwe", "frequent words"
    answers, least_items = TOP, 40  # counts 24, 6, 3, 2... at the least: the top three stand apart
    intro = (
        "Read the following coded text and track the frequency of each coded word. "
        "Find the three most frequently appeared coded words."
    )

    def draw(self, rng: random.Random, items: int) -> list[str]:
        scale = items / sum(1 / rank**ZIPF_ALPHA for rank in range(1, 10_000))
        counts = []
        while (count := round(scale / (len(counts) + 1) ** ZIPF_ALPHA)) > 0:
            counts.append(count)
        listed = [
            word for word, count in zip(pseudo_words(rng, len(counts)), counts, strict=True) for _ in range(count)
        ]
        rng.shuffle(listed)
        return listed

    def item(self, index: int, word: str) -> str:
        return f"{SEPARATOR}{word}" if index == 0 else f" .... {word}"

    def question(self) -> tuple[str, str]:
        return (
            "Question: Do not provide any explanation. Please ignore the dots '....'. "
            "What are the three most frequently appeared words in the above coded text?",
            "Answer: According to the coded text above, the three most frequently appeared words are:",
        )
