"""Filler text for long prompts: plain descriptive prose, generated from a seed, sentence by sentence.

Retrieval in a long context is only a test when the text around the needle is varied (one sentence
repeated makes attention trivial and hides what a lossy cache does to it) and when nothing in it
could pass for the answer or for the question's subject. Real text fails the second rule easily: the
first filler kvsweep used, docstrings of Python's standard library, is about code, keys and passing
values, and a real chat model asked for "the pass key" after it answered about the text instead.

So the filler is kvsweep's own: small scenes of country life (weather, rivers, gardens, markets,
kitchens, birds, roads, seasons), each paragraph a topic, each sentence a template (`filler_scenes.py`)
filled from word lists (`filler_words.py`). The words were chosen to hold no digits and nothing about
passing, keys, locks, secrets, codes or computing (`FORBIDDEN_WORDS`, checked by the tests). The text is kvsweep's own
(Apache-2.0, like the rest of it); nothing is read from disk or downloaded, and paragraph `n` is the
same on every machine and Python version.
"""

import functools
import random
import re

from kvsweep.inputs.filler_scenes import TOPICS
from kvsweep.inputs.filler_words import OPENERS, WORDS

# Words the filler must never contain: the question's subject, what could be taken for the answer.
FORBIDDEN_WORDS = frozenset(
    {
        "pass", "passed", "passing", "passes", "password", "passkey", "key", "keys", "lock", "locked",
        "code", "codes", "secret", "secrets", "hidden", "hide", "remember", "number", "numbers", "digit",
        "digits", "program", "computer", "function", "answer", "question",
    }
)  # fmt: skip
PARAGRAPHS = 1_000_003  # how many distinct paragraphs a prompt may start from (any index works)
SENTENCES = (4, 8)  # fewest and most sentences in a paragraph

OPENER_SHARE = 0.35  # of sentences that get one of `OPENERS` before them
OPENED = (*WORDS["time"], "In ", "At ", "As ", "By ", "When ", "From ", "Along ", "Far out", "On ")


@functools.cache
def paragraph(index: int) -> tuple[str, ...]:
    """The `index`-th paragraph of the filler, as its sentences: the same on every machine."""
    rng = random.Random(f"kvsweep-filler:{index}")
    templates = rng.choice(TOPICS)
    count = rng.randint(*SENTENCES)
    picked = rng.sample(templates, min(count, len(templates)))
    return tuple(_opened(_fill(template, rng), rng) for template in picked)


def _opened(sentence: str, rng: random.Random) -> str:
    """Now and then an opener before the sentence, unless it opens with a phrase of its own already."""
    if rng.random() >= OPENER_SHARE or sentence.startswith(OPENED):
        return sentence
    return f"{rng.choice(OPENERS)}, {sentence[0].lower()}{sentence[1:]}"


SLOT = re.compile(r"\{(\w+)\}")


def _fill(template: str, rng: random.Random) -> str:
    def word(match: re.Match[str]) -> str:
        slot = match.group(1)
        chosen = rng.choice(WORDS[slot.lower()])
        return chosen[0].upper() + chosen[1:] if slot[0].isupper() else chosen

    return SLOT.sub(word, template)
