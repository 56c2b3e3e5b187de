"""The built-in long-context task: a random pass key hidden at a depth in filler text, asked for at the end.

The prompt's words are fixed here; its tokens are laid out by `layout.py`, so the key sits at the
asked depth of the exact context length. The answer is the model's greedy continuation: correct when
the first number in it is the key (a chat model that answers "The pass key is 58213." counts).
"""

import random
import re

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
