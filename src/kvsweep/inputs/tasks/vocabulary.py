"""The words the task suite's needles and lists are made of: key words, and pseudo-words without end.

RULER draws its keys from an English word list and its aggregation tasks' words from the same or from random
letters. kvsweep bundles its own (Apache-2.0, nothing downloaded): an adjective and a noun make a needle's key
("amber-harbour"), never a word of the filler; pseudo-words ("tavomil") give a list task as many distinct words
as a 128k-token context needs, none of which a model could know as more common than another.
"""

import random

ADJECTIVES = (
    "amber", "ancient", "brave", "bright", "calm", "careful", "cheerful", "clever", "copper", "crimson",
    "curious", "daring", "distant", "eager", "elegant", "faithful", "fancy", "fierce", "fragile", "gentle",
    "gifted", "golden", "graceful", "hollow", "honest", "humble", "icy", "jolly", "keen", "lively",
    "lonely", "loyal", "lucky", "marble", "mighty", "modest", "narrow", "nimble", "noble", "patient",
    "polite", "proud", "quiet", "rapid", "rare", "restless", "rustic", "scarlet", "serene", "silent",
    "silver", "slender", "smooth", "solemn", "steady", "sturdy", "swift", "tender", "tidy", "vast",
    "velvet", "vivid", "wandering", "wary", "wise", "witty", "wooden", "young", "zealous", "zesty",
)  # fmt: skip
NOUNS = (
    "anchor", "anvil", "arch", "badge", "banner", "beacon", "bell", "blanket", "bottle", "bracelet",
    "bridge", "bucket", "cabin", "camera", "candle", "canyon", "castle", "chimney", "compass", "crystal",
    "cushion", "diamond", "drum", "engine", "falcon", "feather", "fountain", "galaxy", "glacier", "guitar",
    "hammer", "harbour", "helmet", "island", "jacket", "kettle", "kite", "ladder", "lantern", "magnet",
    "meadow", "mirror", "monument", "needle", "oasis", "orchestra", "paddle", "palace", "parrot", "pebble",
    "pencil", "pillow", "planet", "puzzle", "quilt", "rocket", "saddle", "scroll", "shield", "spiral",
    "statue", "teapot", "telescope", "thimble", "tower", "trumpet", "tunnel", "umbrella", "violin", "wagon",
)  # fmt: skip
ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "gr", "pl", "st", "tr")
VOWELS = ("a", "e", "i", "o", "u")
CODAS = ("", "", "", "n", "l", "r", "m")
SYLLABLES = tuple(onset + vowel + coda for onset in ONSETS for vowel in VOWELS for coda in CODAS)


def key_word(rng: random.Random) -> str:
    """A needle's key, 'adjective-noun'."""
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def distinct_keys(rng: random.Random, count: int) -> list[str]:
    """`count` different keys."""
    keys: list[str] = []
    while len(keys) < count:
        key = key_word(rng)
        if key not in keys:
            keys.append(key)
    return keys


def pseudo_words(rng: random.Random, count: int, syllables: tuple[int, int] = (2, 3)) -> list[str]:
    """`count` different pronounceable non-words of 2-3 syllables ('tavomil'), in the order drawn."""
    seen: set[str] = set()
    words: list[str] = []
    while len(words) < count:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(*syllables)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words
