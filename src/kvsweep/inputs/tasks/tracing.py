"""Variable tracking, RULER's multi-hop tracing task (Hsieh et al., 2024, section 3.1).

A chain of assignments is spread through the noise haystack: "VAR QXJPT = 48213." then "VAR MBRKA = VAR QXJPT."
and so on, four hops (RULER's default). The question names the number; the answer is every variable the chain
assigns it to, five names. The chain's statements sit at evenly spaced depths, in order, so following it means
attending across the whole context.
"""

import itertools
import random
import string

from kvsweep.inputs.tasks.base import SEPARATOR, LaidOutTask, Layout, TaskKit, needle_body
from kvsweep.inputs.tasks.haystack import NOISE_HAYSTACK

INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
HOPS = 4  # assignments after the first: RULER's num_hops


def variable_names(rng: random.Random, count: int) -> list[str]:
    """`count` different five-letter upper-case names."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    return names


class VariableTracking(LaidOutTask):
    name, title, haystack = "vt", "variable tracking", NOISE_HAYSTACK

    def layout(self, kit: TaskKit, rng: random.Random, depth: float) -> Layout:
        names = variable_names(rng, HOPS + 1)
        value = str(rng.randint(10_000, 99_999))
        statements = [f"VAR {names[0]} = {value}.", *(f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names))]
        depths = [(step + 0.5) / len(statements) for step in range(len(statements))]
        question = f"{SEPARATOR}Question: Find all variables that are assigned the value {value} in the text above."
        lead = (
            "Answer: According to the chain(s) of variable assignment in the text above, "
            f"{len(names)} variables are assigned the value {value}, they are:"
        )
        needles = list(zip(depths, statements, strict=True))
        body, least = needle_body(kit, self.haystack, rng, needles, tuple(names), None)
        return Layout(kit.encode(INTRO), kit.encode(question), kit.lead(lead), body, least)
