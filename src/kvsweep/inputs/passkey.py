"""The built-in long-context task: a random pass key hidden at a depth in filler text, asked for at the end.

The prompt's words are fixed here; its tokens are laid out by `layout.py`, so the key sits at the
asked depth of the exact context length. The answer is the model's greedy continuation: correct when
the first number in it is the key (a chat model that answers "The pass key is 58213." counts).

Whether a model's greedy answer is right: the pass key, or a prompts file's expected answer.

Exact match on a normalised answer, the way reading-comprehension benchmarks score it: a model that
says "Paris." or " paris" for "Paris" is right; one that says "Paris, France" is not (say so in the
file's answer if that is what is wanted). The answer is the first non-empty line, or its first
sentence ("Paris. It is the capital." answers "Paris"), so what a model goes on to say after its
answer does not turn a right answer wrong.
"""

import random
import re
import string
import unicodedata

from kvsweep.inputs.spec import PASSKEY

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


def answer_correct(prompt, text: str) -> bool:
    """A task prompt's verdict on the model's answer (`prompt` is an `inputs.prompts.Prompt`)."""
    if prompt.answer is None:
        return False
    if prompt.kind == PASSKEY:
        return key_found(text, prompt.answer)
    return exact_match(text, prompt.answer)
