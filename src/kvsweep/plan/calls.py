"""How many `generate` calls one cell can make at most: what the planner holds against the cell's timeout.

A cell (`cell/run_cell.py`) makes one cold call, `warmup` uncounted calls, its measured phase, and one call
of its own strategy for the quality check (the check's other call is the dynamic baseline's, which
moves nothing over the host link); a cell fed text also answers its task prompts, a call per batch of
them (`task_calls`; each generates fewer tokens than a measured call, so counting them whole is an
upper bound). The measured phase follows `measure/sampling.py`; for calls of at
least `call_s` seconds each, the most calls its rules allow are:

- kept calls: at least `repeats`; more while the kept calls add up to less than `min_duration_s`
  (`ceil(min_duration_s / call_s)` calls reach it), or, with a precision target, until `repeat_cap`
  (the target may never be met); never more than `repeat_cap`;
- discarded calls: up to `max_discarded`, each re-run, at any point of the phase, while the contention
  guard is on. `max_host_contention=1` turns it off: a call is discarded when others took more than
  that share of the cell's CPUs beyond the reading's resolution (`CallContention.over`), and no share
  exceeds 1, so none is (the guard tightens to 0 only in a niced process, and kvsweep's Ray workers
  run at niceness 0);
- with a time cap (`max_duration_s`), no call starts once `repeats` calls are kept and the calls so far
  took the cap: at most `ceil(max_duration_s / call_s)` calls, unless `repeats + max_discarded` are
  needed to keep `repeats`.

The pause after a discarded call (at most 1 s) is left out: next to the calls of minutes that make an
offloaded cell's time it does not count.
"""

import math
from dataclasses import dataclass

from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.inputs.spec import RANDOM

COLD_CALLS = 1
QUALITY_CALLS = 1
GUARD_OFF = 1.0  # `max_host_contention` at which no call is ever discarded


@dataclass(frozen=True)
class CallCount:
    """The worst case of one cell's calls, by kind."""

    cold: int
    warmup: int
    kept: int
    discarded: int
    quality: int
    task: int = 0  # task prompts' calls (a text-fed cell)

    @property
    def measured(self) -> int:
        return self.kept + self.discarded

    @property
    def total(self) -> int:
        return self.cold + self.warmup + self.measured + self.quality + self.task


def task_calls(cell: Cell, protocol: MeasureProtocol) -> int:
    """Calls a cell makes to answer its task prompts: whole batches of at least `quality_trials` prompts."""
    trials = protocol.inputs.quality_trials
    if cell.inputs == RANDOM or trials <= 0:
        return 0
    return math.ceil(trials / cell.batch_size)


def most_kept(protocol: MeasureProtocol, call_s: float) -> int:
    """Kept calls before the measured phase stops by itself (no time cap)."""
    cap = protocol.measure.repeat_cap
    if protocol.measure.target_rel_ci > 0 or call_s <= 0:
        return cap
    return min(cap, max(protocol.measure.repeats, math.ceil(protocol.measure.min_duration_s / call_s)))


def most_discarded(protocol: MeasureProtocol) -> int:
    """Calls the phase may discard and re-run: `max_discarded`, or none with the contention guard off."""
    return protocol.measure.max_discarded if protocol.measure.max_host_contention < GUARD_OFF else 0


def most_measured(protocol: MeasureProtocol, call_s: float) -> int:
    """Measured calls, kept and discarded, under every rule of the phase, the time cap included."""
    discarded = most_discarded(protocol)
    unbounded = most_kept(protocol, call_s) + discarded
    if protocol.measure.max_duration_s <= 0 or call_s <= 0:
        return unbounded
    until_cap = math.ceil(protocol.measure.max_duration_s / call_s)
    return min(unbounded, max(protocol.measure.repeats + discarded, until_cap))


def worst_case_calls(protocol: MeasureProtocol, call_s: float, tasks: int = 0) -> CallCount:
    """Every call a cell makes when every discard it may re-run is re-run; `call_s`: a lower bound on one
    call's time (fewer seconds per call, more calls to reach the time floor: the count stays an upper bound);
    `tasks`: the cell's `task_calls`."""
    measured = most_measured(protocol, call_s)  # never fewer than repeats + the discards
    discarded = most_discarded(protocol)
    return CallCount(COLD_CALLS, protocol.measure.warmup, measured - discarded, discarded, QUALITY_CALLS, tasks)
