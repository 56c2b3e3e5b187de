"""How a config key is declared: its default, its help and the values it accepts (`Bound`), in one `setting(...)`.

Apart from the schema so the measure settings, which every cell carries, import no Hydra.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Bound:
    """The values a numeric key accepts (each item of a list or map key): `low <= value <= high`."""

    low: float
    high: float | None = None
    low_open: bool = False  # `low < value` instead
    meaning: str = ""  # what the range stands for, said in the error

    def allows(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value <= self.high)

    def describe(self) -> str:
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        return f"{text} ({self.meaning})" if self.meaning else text


AT_LEAST_0 = Bound(0)
AT_LEAST_1 = Bound(1)
POSITIVE = Bound(0, low_open=True)
SHARE = Bound(0, 1)


def one_of(choices: tuple[str, ...]) -> str:
    """`a, b or c`: a choice list as help text says it."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else "".join(choices)


def setting(default: Any, text: str, bound: Bound | None = None) -> Any:
    metadata = {"help": text} if bound is None else {"help": text, "bound": bound}
    if callable(default):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)
