"""Whether a model's greedy answer is right: the pass key, or a prompts file's expected answer.

Exact match on a normalised answer, the way reading-comprehension benchmarks score it: a model that
says "Paris." or " paris" for "Paris" is right; one that says "Paris, France" is not (say so in the
file's answer if that is what is wanted). The answer is the first non-empty line, or its first
sentence ("Paris. It is the capital." answers "Paris"), so what a model goes on to say after its
answer does not turn a right answer wrong.
"""

import re
import string
import unicodedata

from kvsweep.inputs.passkey import key_found
from kvsweep.inputs.spec import PASSKEY

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


def answer_correct(prompt, text: str) -> bool:
    """A task prompt's verdict on the model's answer (`prompt` is an `inputs.prompts.Prompt`)."""
    if prompt.answer is None:
        return False
    if prompt.kind == PASSKEY:
        return key_found(text, prompt.answer)
    return exact_match(text, prompt.answer)
