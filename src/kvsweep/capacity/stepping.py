"""The search along one axis: gallop from the planner's predicted boundary, then bisect.

Values are whole steps (a batch size, or a context in units of `search.context_step`) from 1 to a
ceiling. With an exact prediction the search takes two probes: the predicted value passes, the next one
fails. Each further probe doubles the distance from the prediction (1, 3, 7 ...) until the frontier is
bracketed, then halves the bracket: about 2 log2(error) probes for a prediction off by `error`, and with
no prediction (start 1) plain doubling. Probes never go above a known failure nor below a known pass, so
assuming a failure at v means a failure above v (memory does; an SLO nearly does), the search ends on a
passing value whose next value fails, or on the ceiling.

Pure and deterministic: the same outcomes give the same probes, which is what lets an interrupted
search resume through the probes it already has.
"""

from dataclasses import dataclass, field


@dataclass
class Stepping:
    ceiling: int
    start: int  # the predicted boundary (clipped to 1..ceiling); 1 when nothing is predicted
    outcomes: dict[int, bool] = field(default_factory=dict)  # value -> passed
    stopped: bool = False  # a probe ended in neither pass nor a size-driven failure

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

    def record(self, value: int, passed: bool) -> None:
        self.outcomes[value] = passed

    def next_value(self) -> int | None:
        """The next value to probe, or None when the frontier is found (or stopped)."""
        if self.done:
            return None
        if not self.outcomes:
            return self.start
        low, high = self.best, self.lowest_failure
        if high > self.ceiling:  # nothing failed yet: gallop up from the start
            ups = sum(1 for v in self.outcomes if v > self.start)
            return min(self.ceiling, max(low, self.start) + (1 << ups))
        if low == 0:  # nothing passed yet: gallop down from the start
            downs = sum(1 for v in self.outcomes if v < self.start)
            return max(1, min(high, self.start) - (1 << downs))
        return (low + high) // 2
