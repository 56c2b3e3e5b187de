"""Which parent run a starting sweep writes to: the one it resumes, when no live sweep holds it, or a new one.

Two identical sweeps started together must not both measure into one parent. Resuming, a sweep takes the latest
parent's lease first (`lease.py`). With no parent yet, each creates its own already leased, waits, and looks at
every leased parent of the sweep: the earliest started (then lowest run id) goes on; the others delete theirs
(no cells yet), look again, find that one held, and refuse.
"""

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvsweep.names import RunTag
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import SweepHeader
from kvsweep.tracking.lease import Lease, LeaseHeld, LeaseTimes, Owner, Verdict, claim, judge, lease_tags

ATTEMPTS = 4  # a parent withdrawn, deleted or released while this sweep looked at it: look again, in all


@dataclass(frozen=True)
class Taken:
    run_id: str
    lease: Lease  # renewing already; the sink releases it when the sweep ends
    resumed: bool  # an existing parent (its finished cells are not run again), or a new one


def take_parent(
    tracker: SweepTracker, header: SweepHeader, resume: bool, times: LeaseTimes, say: Callable[[str], None]
) -> Taken:
    """This sweep's parent run, leased to it. Raises `LeaseHeld` when another live sweep writes to it."""
    owner = Owner.here()
    _ = tracker.experiment_id  # found or made first: a rival making it too must not make the start below slow
    found = None
    for attempt in range(ATTEMPTS):
        if attempt:  # rivals that withdrew together look again apart
            time.sleep(random.uniform(0, times.settle_s))
        looked = time.monotonic()
        found = tracker.find_sweep(header.sweep_key) if resume else None
        if found is None:
            taken = _new_parent(tracker, header, owner, times, looked if resume else None)
        else:
            taken = _resume(tracker, header, found, owner, times, say)
        if taken is not None:
            return taken
    raise LeaseHeld(header.name, found or "", None, "identical sweeps kept starting at the same moment")


def _resume(
    tracker: SweepTracker, header: SweepHeader, run_id: str, owner: Owner, times: LeaseTimes, say: Callable[[str], None]
) -> Taken | None:
    """The found parent, if its lease is free or stale and this sweep's claim holds; None: look again."""

    def watching(holder: Owner | None) -> None:
        where = f"host {holder.host} (pid {holder.pid})" if holder else "another sweep"
        say(
            f"parent run {run_id} is leased to {where}, which cannot be checked from here; "
            f"watching its heartbeat for up to {times.period_s:.0f} s"
        )

    verdict, seen = judge(tracker.client, run_id, times, watching)
    if verdict is Verdict.LIVE:
        raise LeaseHeld(header.name, run_id, seen.owner)
    if verdict is Verdict.GONE:
        return None
    if claim(tracker.client, run_id, owner, times, seen):
        return Taken(run_id, Lease(tracker.client, run_id, owner, times).start(), resumed=True)
    return None  # a rival's claim came later: look again, and refuse naming it once it holds the lease


def _new_parent(
    tracker: SweepTracker, header: SweepHeader, owner: Owner, times: LeaseTimes, looked: float | None
) -> Taken | None:
    """A parent of this sweep's own; None: withdrawn for a rival's, look again. `looked`: when this sweep
    found none to resume (a rival that found none either may be creating one too: only one goes on); None
    for rerun=true, a parent of its own whatever else runs."""
    run_id = tracker.create_parent(header.name, header.sweep_key, lease_tags(owner))
    if looked is not None:
        prompt = time.monotonic() - looked <= times.window_s
        time.sleep(times.settle_s)
        if not goes_on(tracker.sweep_runs(header.sweep_key), run_id, prompt):
            tracker.client.delete_run(run_id)  # no cell yet; a resume must not find it
            return None
    tracker.describe_parent(run_id, header.name, header.params, header.config_yaml)
    return Taken(run_id, Lease(tracker.client, run_id, owner, times).start(), resumed=False)


def goes_on(parents: list[Any], mine: str, prompt: bool) -> bool:
    """Whether `mine` is the one of this sweep's leased parents that goes on: the earliest started, then the
    lowest run id.

    A slow start (it found none and created its parent more than `window_s` later) goes on only alone: a rival
    may have looked before that parent existed and decided without it."""
    rivals = [r for r in parents if r.info.run_id != mine and r.data.tags.get(RunTag.LEASE_OWNER)]
    own = [r for r in parents if r.info.run_id == mine]
    if not rivals:
        return True
    if not prompt or not own:
        return False
    return min(rivals + own, key=_started).info.run_id == mine


def _started(run: Any) -> tuple[int, str]:
    return run.info.start_time, run.info.run_id
