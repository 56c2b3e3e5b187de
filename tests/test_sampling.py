"""The measured phase's rules: which calls count, when to re-run, when to stop.

The calls and the contention readings are scripted through the phase's own seams (the call and
the meter), so each rule is checked against a count worked out by hand.
"""

import itertools
import math

import pytest

from kvsweep.config.measure_config import MeasureConfig
from kvsweep.grid import RULES_OFF
from kvsweep.measure.contention import CallContention
from kvsweep.measure.sampling import TokenTimes, measure_phase

QUIET = CallContention(other_s=0.0, steal_s=0.0, capacity_s=2.0, cpus=2)
BUSY = CallContention(other_s=1.0, steal_s=0.0, capacity_s=2.0, cpus=2)  # others took half


class ScriptedMeter:
    def __init__(self, readings):
        self.readings = iter(readings)

    def start(self):
        pass

    def stop(self):
        return next(self.readings)


def calls(ttfts):
    """A call whose TTFT follows the script (TPOT 1 ms, 4 tokens); returns the call's index."""
    script = iter(enumerate(ttfts))

    def call():
        return next(script)

    def times_of(item):
        _, ttft = item
        return TokenTimes(ttft, [1.0, 1.0, 1.0], ttft + 3.0)

    return call, times_of


def no_sleep(_seconds):
    pass


def rules_with(max_contention: float = math.inf, repeat_cap: int = 0, **given):
    """The phase's rules as given, every other one off (no time floor, cap, guard, target or time cap)."""
    return MeasureConfig(**{**RULES_OFF, "max_host_contention": max_contention, "max_repeats": repeat_cap, **given})


def test_contended_calls_are_re_run_until_the_budget_is_spent_then_kept():
    call, times_of = calls(itertools.repeat(10.0))
    readings = [BUSY, QUIET, BUSY, BUSY, BUSY, BUSY, QUIET]
    rules = rules_with(repeats=4, max_contention=0.1, max_discarded=3)
    phase = measure_phase(call, times_of, rules, ScriptedMeter(readings), no_sleep)
    # call 0 busy -> discarded (1); 1 quiet -> kept; 2, 3 busy -> discarded (2, 3);
    # budget spent: 4 and 5 kept although busy; 6 kept: four kept calls.
    assert [s.call[0] for s in phase.discarded] == [0, 2, 3]
    assert [s.call[0] for s in phase.kept] == [1, 4, 5, 6]
    assert [s.contention for s in phase.kept] == [QUIET, BUSY, BUSY, QUIET]


def test_an_unreadable_host_discards_nothing():
    call, times_of = calls(itertools.repeat(10.0))
    rules = rules_with(repeats=3, max_contention=0.1, max_discarded=5)
    phase = measure_phase(call, times_of, rules, ScriptedMeter(itertools.repeat(None)), no_sleep)
    assert len(phase.kept) == 3 and not phase.discarded


def test_a_precision_target_stops_as_soon_as_the_intervals_are_narrow_enough():
    call, times_of = calls(itertools.repeat(10.0))  # no noise at all
    rules = rules_with(repeats=3, repeat_cap=50, target_rel_ci=0.01)
    phase = measure_phase(call, times_of, rules, ScriptedMeter(itertools.repeat(QUIET)), no_sleep)
    assert len(phase.kept) == 6  # the fewest samples with a true 95% interval of the median
    assert phase.target_met is True


def test_a_noisy_cell_runs_to_the_cap_and_says_it_missed_the_target():
    call, times_of = calls(itertools.cycle([10.0, 20.0]))
    rules = rules_with(repeats=3, repeat_cap=12, target_rel_ci=0.01)
    phase = measure_phase(call, times_of, rules, ScriptedMeter(itertools.repeat(QUIET)), no_sleep)
    assert len(phase.kept) == 12
    assert phase.target_met is False


def test_without_a_target_the_count_and_the_time_floor_decide():
    call, times_of = calls(itertools.repeat(100.0))  # 103 ms per call
    rules = rules_with(repeats=3, min_duration_s=1.0, repeat_cap=30)
    phase = measure_phase(call, times_of, rules, ScriptedMeter(itertools.repeat(QUIET)), no_sleep)
    assert len(phase.kept) == 10  # ceil(1.0 s / 0.103 s)
    assert phase.target_met is None


def test_the_pause_doubles_while_calls_stay_contended_so_a_burst_can_pass():
    call, times_of = calls(itertools.repeat(200.0))  # 203 ms calls
    pauses = []
    rules = rules_with(repeats=1, max_contention=0.1, max_discarded=6)
    measure_phase(call, times_of, rules, ScriptedMeter([BUSY] * 6 + [QUIET]), pauses.append)
    assert pauses == pytest.approx([0.203, 0.406, 0.812, 1.0, 1.0, 1.0])
