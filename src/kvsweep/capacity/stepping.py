"""The search along one axis: gallop from the planner's predicted boundary, then bisect.

Values are whole steps (a batch size, or a context in units of `search.context_step`) from 1 to a
ceiling. With an exact prediction the search takes two probes: the predicted value passes, the next one
fails. Each further probe doubles the distance from the prediction (1, 3, 7 ...) until the frontier is
bracketed, then halves the bracket: about 2 log2(error) probes for a prediction off by `error`, and with
no prediction (start 1) plain doubling. Probes never go above a known failure nor below a known pass, so
assuming a failure at v means a failure above v (memory does; an SLO nearly does), the search ends on a
passing value whose next value fails, or on the ceiling.

Readings sharpen it: after a probe, `aim` may say where its measured memory or latency puts the frontier
(a straight line through the readings, `capacity/aim.py`); the next probe goes there, kept inside the
bracket, instead of the next doubling or the middle. A failure without a reading (an OOM) drops the aim.
Where passes bring readings (`halve_down`: peak device memory on CUDA, latency under an SLO), a failed
start is followed by half of it rather than the next step down: one pass, then its aim, is shorter than
walking down from an overestimate without readings.

Pure and deterministic: the same outcomes and readings give the same probes, which is what lets an
interrupted search resume through the probes it already has.
"""

from dataclasses import dataclass, field


@dataclass
class Stepping:
    ceiling: int
    start: int  # the predicted boundary (clipped to 1..ceiling); 1 when nothing is predicted
    outcomes: dict[int, bool] = field(default_factory=dict)  # value -> passed
    stopped: bool = False  # a probe ended in neither pass nor a size-driven failure
    aim: int | None = None  # where the last probe's readings put the frontier (`capacity/aim.py`); None: none
    halve_down: bool = False  # passes will bring readings: below a failed start, halve instead of galloping

    def __post_init__(self) -> None:
        self.start = min(max(self.start, 1), self.ceiling)

    @property
    def best(self) -> int:
        """The largest value known to pass below every known failure (0: none passed)."""
        return max((v for v, ok in self.outcomes.items() if ok and v < self.lowest_failure), default=0)

    @property
    def lowest_failure(self) -> int:
        return min((v for v, ok in self.outcomes.items() if not ok), default=self.ceiling + 1)

    @property
    def done(self) -> bool:
        return self.stopped or self.lowest_failure == self.best + 1 or self.best == self.ceiling

    def record(self, value: int, passed: bool, aim: int | None = None) -> None:
        """An outcome, and where its readings put the frontier (an aim lasts until the next outcome)."""
        self.outcomes[value] = passed
        self.aim = aim

    def next_value(self) -> int | None:
        """The next value to probe, or None when the frontier is found (or stopped)."""
        if self.done:
            return None
        if not self.outcomes:
            return self.start
        low, high = self.best, self.lowest_failure
        if self.aim is not None and low > 0:  # a reading's estimate, kept inside the bracket
            aimed = min(max(self.aim, low + 1), min(high, self.ceiling + 1) - 1)
            if aimed not in self.outcomes:
                return aimed
        if high > self.ceiling:  # nothing failed yet: gallop up from the start
            ups = sum(1 for v in self.outcomes if v > self.start)
            return min(self.ceiling, max(low, self.start) + (1 << ups))
        if low == 0 and self.halve_down:  # one pass, and its reading aims at the frontier
            return max(1, high // 2)
        if low == 0:  # nothing passed yet: gallop down from the start
            downs = sum(1 for v in self.outcomes if v < self.start)
            return max(1, min(high, self.start) - (1 << downs))
        return (low + high) // 2


def start_of(predicted: int | None, step: int) -> int:
    """Where a search starts, in steps: at the predicted boundary, else at the smallest value."""
    return max(predicted // step, 1) if predicted else 1
