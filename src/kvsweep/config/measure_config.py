"""The `measure` keys: how every cell of a sweep is measured. The measure config *is* the cell's protocol
(`grid.MeasureProtocol` embeds it), so a key added here reaches the cells, their ids and the sampling rules
with no copy to keep in step. Free of Hydra: every cell process carries it.
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


@dataclass
class MeasureConfig:
    """The `default` measure preset: one warmup, at least five runs and 2 s of them (at most 30)."""

    warmup: int = setting(1, "uncounted runs after the cold first call", AT_LEAST_0)
    repeats: int = setting(5, "measured runs behind each median (at least)", AT_LEAST_1)
    min_duration_s: float = setting(
        2.0, "keep measuring until the measured runs add up to this many seconds", AT_LEAST_0
    )
    max_repeats: int = setting(
        30, "cap on measured runs when min_duration_s or target_rel_ci asks for more; 0 = repeats", AT_LEAST_0
    )
    seed: int = setting(0, "seed for random weights and input ids", AT_LEAST_0)
    threads: int = setting(
        0,
        "torch intra-op threads in a cell; 0 = auto: a CPU cell every core it may use, a CUDA cell ray.cpus_per_cell",
        AT_LEAST_0,
    )
    wait_for_idle_gpu_s: float = setting(
        0.0, "wait up to this long for other processes to leave the cell's GPU", AT_LEAST_0
    )
    max_host_contention: float = setting(
        0.05,
        "discard and re-run a call when others took more than this share of the cell's CPUs (1 = off)",
        Bound(0, 1, low_open=True, meaning="a share of the cell's CPUs; 1 = off"),
    )
    max_discarded: int = setting(
        8,
        "contended calls re-run per cell before its numbers are kept and tagged (the planner counts them all "
        "in an offloaded cell's time)",
        AT_LEAST_0,
    )
    target_rel_ci: float = setting(
        0.0, "keep measuring until each 95% interval is within +-this share of its median (0 = off)", AT_LEAST_0
    )
    max_duration_s: float = setting(
        60.0, "time cap on a cell's measured phase, re-runs included (0 = none)", AT_LEAST_0
    )
    quality_trials: int = setting(
        16,
        "prompts of each task (the suite's, or a file's) a cell answers after its timed calls, at least; 0 = none",
        AT_LEAST_0,
    )
    device_memory_limit_gb: float = setting(
        0.0,
        "run each cell as if its device had this many GB (1e9 bytes): on CUDA torch's allocator is capped, on "
        "CPU the cell process's data segment past what it holds at start; the planner fits cells to it; 0 = none",
        AT_LEAST_0,
    )

    @property
    def repeat_cap(self) -> int:
        """At most this many measured calls: `max_repeats`, never fewer than `repeats`."""
        return max(self.repeats, self.max_repeats)
