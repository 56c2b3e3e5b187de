"""Needle in a haystack, RULER's four retrieval tasks (Hsieh et al., 2024, "RULER: What's the Real Context Size
of Your Long-Context Language Models?", section 3.1).

Each needle is a sentence "One of the special magic numbers for <key> is: <7 digits>." between two sentences of the
haystack. The question asks for one key's number (`niah_single`, `niah_multikey`), for every number of one key
(`niah_multivalue`), or for the numbers of several keys at once (`niah_multiquery`). Distractors are needles too:
with other keys (multi-key, multi-query) or more values of the same key (multi-value); the needle asked for sits at
the trial's depth (`inputs.depths`, in turn), the others at seeded depths. `niah_single` hides its needle in the
repeated noise sentences (RULER's niah_single_1), the others in varied prose (RULER uses essays).
"""

import random

from kvsweep.inputs.tasks.base import SEPARATOR, LaidOutTask, Layout, TaskKit, needle_body
from kvsweep.inputs.tasks.haystack import NOISE_HAYSTACK, PROSE_HAYSTACK
from kvsweep.inputs.tasks.vocabulary import distinct_keys

INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards."
)
NEEDLES = 4  # RULER's count of keys (multi-key, multi-query) or values (multi-value)


def magic_number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _and(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} and {keys[-1]}"


class _Niah(LaidOutTask):
    keys: int = 1  # needles with different keys
    values_per_key: int = 1  # needles with the same key
    asked: int = 1  # keys the question asks for

    def layout(self, kit: TaskKit, rng: random.Random, depth: float) -> Layout:
        keys = distinct_keys(rng, self.keys)
        values = {key: [magic_number(rng) for _ in range(self.values_per_key)] for key in keys}
        asked = keys[: self.asked]
        needles = [
            (depth if (key, n) == (asked[0], 0) else rng.random(), needle(key, value))
            for key in keys
            for n, value in enumerate(values[key])
        ]
        expected = tuple(value for key in asked for value in values[key])
        plural = len(expected) > 1
        what = "are all the special magic numbers" if plural else "is the special magic number"
        question = f"{SEPARATOR}What {what} for {_and(asked)} mentioned in the provided text?"
        verb = "are" if plural else "is"
        lead = f"The special magic number{'s' * plural} for {_and(asked)} mentioned in the provided text {verb}"
        body, least = needle_body(kit, self.haystack, rng, needles, expected, depth)
        return Layout(kit.encode(INTRO), kit.encode(question), kit.lead(lead), body, least)


class NiahSingle(_Niah):
    """One needle, one question about it, in the noise haystack."""

    name, title, haystack = "niah_single", "single NIAH", NOISE_HAYSTACK


class NiahMultikey(_Niah):
    """Four needles with different keys in prose; one key asked for."""

    name, title, haystack = "niah_multikey", "multi-key NIAH", PROSE_HAYSTACK
    keys = NEEDLES


class NiahMultivalue(_Niah):
    """Four needles with the same key in prose; every value asked for."""

    name, title, haystack = "niah_multivalue", "multi-value NIAH", PROSE_HAYSTACK
    values_per_key = NEEDLES


class NiahMultiquery(_Niah):
    """Four needles with different keys in prose; all four asked for at once."""

    name, title, haystack = "niah_multiquery", "multi-query NIAH", PROSE_HAYSTACK
    keys = asked = NEEDLES
