"""The parent run's lease on a real sqlite MLflow store: who may resume a parent, and who must refuse.

Holders are real processes (a `python -c` that takes the parent and sleeps, killed with SIGKILL), rivals
real forked processes released together at a barrier; nothing is mocked. A reader "elsewhere" is one
told not to check the holder's process (`by_pid=False`): it has only the heartbeat to go by.
"""

import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from kvsweep.errors import ConfigError
from kvsweep.testing.testing_config import seams_from
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import SweepHeader
from kvsweep.tracking.lease import LeaseHeld, LeaseLost, LeaseTimes, Owner, lease_tags, write
from kvsweep.tracking.take_parent import goes_on, take_parent

KEY = "key-lease"
# Tests that start a holder process or fork rivals: 3-9 s each on two cores (MLflow imported per process).
# Multi-process reliability: the heavy tier (CONTRIBUTING.md).
spawns = pytest.mark.heavy
QUICK = LeaseTimes(beat_s=0.2, period_s=2.0, window_s=1.0)
ELSEWHERE = LeaseTimes(beat_s=0.2, period_s=2.0, window_s=1.0, by_pid=False)
HOLDER = """
import sys, time
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import SweepHeader
from kvsweep.tracking.lease import LeaseTimes
from kvsweep.tracking.take_parent import take_parent

uri = sys.argv[1]
header = SweepHeader("lease", sys.argv[2], "kvsweep", uri, "cpu", "name: lease\\n", {"name": "lease"})
taken = take_parent(SweepTracker(uri, "kvsweep"), header, True, LeaseTimes(beat_s=0.2), print)
print(taken.run_id, flush=True)
time.sleep(600)
"""


# A holder that reports losing its lease: `lost <the line>` once its beats find the parent another's.
LOSING_HOLDER = """
import sys, time
from kvsweep.tracking.client import SweepTracker
from kvsweep.tracking.journal import SweepHeader
from kvsweep.tracking.lease import LeaseTimes
from kvsweep.tracking.take_parent import take_parent

uri = sys.argv[1]
header = SweepHeader("lease", sys.argv[2], "kvsweep", uri, "cpu", "name: lease\\n", {"name": "lease"})
times = LeaseTimes(beat_s=0.2, period_s=2.0, by_pid=False)
taken = take_parent(SweepTracker(uri, "kvsweep"), header, True, times, print)
print(taken.run_id, flush=True)
while taken.lease.lost is None:
    time.sleep(0.05)
try:
    taken.lease.ensure()
except Exception as exc:
    print(type(exc).__name__, exc, flush=True)
"""


def header(uri: str) -> SweepHeader:
    return SweepHeader("lease", KEY, "kvsweep", uri, "cpu", "name: lease\n", {"name": "lease"})


@pytest.fixture
def uri(migrated_store, tmp_path) -> str:
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def take(uri: str, times: LeaseTimes = QUICK, said: list[str] | None = None):
    return take_parent(
        SweepTracker(uri, "kvsweep"), header(uri), True, times, (said if said is not None else []).append
    )


def start_holder(uri: str) -> tuple[subprocess.Popen, str]:
    """A real process holding this sweep's parent (it creates one), renewing every 0.2 s; with its run id."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, uri, KEY], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line, "the holder ended before it held a parent"
    return proc, line


def kill_9(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


def lease_tags_of(uri: str, run_id: str) -> dict[str, str]:
    return {k: v for k, v in MlflowClient(uri).get_run(run_id).data.tags.items() if k.startswith("kvsweep.lease")}


@spawns
def test_a_live_sweep_on_this_host_is_refused_at_once_naming_host_and_pid(uri):
    holder, parent = start_holder(uri)
    try:
        began = time.monotonic()
        with pytest.raises(LeaseHeld) as refused:
            take(uri)
        assert time.monotonic() - began < 1.0  # its process is checked, not its heartbeat watched
    finally:
        kill_9(holder)
    text = str(refused.value)
    assert f"host {socket.gethostname()} (pid {holder.pid})" in text and parent in text and "rerun=true" in text
    assert "\n" not in text


@spawns
def test_a_sweep_killed_with_sigkill_on_this_host_is_resumed_at_once(uri):
    holder, parent = start_holder(uri)
    kill_9(holder)
    patient = LeaseTimes(beat_s=0.2, period_s=6.0, window_s=1.0)  # waiting its lease out would take 6 s or more
    began = time.monotonic()
    taken = take(uri, patient)
    try:
        assert (taken.run_id, taken.resumed) == (parent, True)
        # no waiting out the lease: its dead pid is seen at once (2.25 s was seen once on a loaded 2-core CI-like
        # machine against a 2 s lease, so the lease here is long enough to tell the two apart under load)
        assert time.monotonic() - began < patient.period_s - 2.0
        owner = Owner.parse(lease_tags_of(uri, parent)["kvsweep.lease_owner"])
        assert owner is not None and owner.pid == os.getpid()
    finally:
        taken.lease.release()
    assert lease_tags_of(uri, parent) == {}  # released: cleared, not left to expire


@spawns
def test_from_elsewhere_a_beating_lease_is_refused_and_a_silent_one_expires_after_its_period(uri):
    holder, parent = start_holder(uri)
    try:
        began = time.monotonic()
        with pytest.raises(LeaseHeld) as refused:
            take(uri, ELSEWHERE)
        assert time.monotonic() - began < ELSEWHERE.period_s  # the first renewal it saw was enough
        assert f"(pid {holder.pid})" in str(refused.value)
    finally:
        kill_9(holder)
    said: list[str] = []
    began = time.monotonic()
    taken = take(uri, ELSEWHERE, said)
    waited = time.monotonic() - began
    taken.lease.release()
    assert (taken.run_id, taken.resumed) == (parent, True)
    assert ELSEWHERE.period_s <= waited < ELSEWHERE.period_s + 5
    assert any(f"pid {holder.pid}" in s and "watching its heartbeat" in s for s in said), said


def test_a_held_parent_is_refused_a_released_one_resumed_and_a_rerun_gets_its_own(uri):
    first = take(uri)
    assert not first.resumed
    with pytest.raises(LeaseHeld, match=rf"\(pid {os.getpid()}\), writing to parent run {first.run_id}"):
        take(uri)  # a holder in this very process: alive
    first.lease.release()
    again = take(uri)
    assert (again.run_id, again.resumed) == (first.run_id, True)
    tracker = SweepTracker(uri, "kvsweep")
    rerun = take_parent(tracker, header(uri), False, QUICK, print)  # rerun=true: never refused, never resumes
    assert rerun.run_id != first.run_id and not rerun.resumed
    for taken in (again, rerun):
        taken.lease.release()


def _rival(uri: str, barrier, answers, done, delay_s: float) -> None:
    barrier.wait()
    time.sleep(delay_s)
    try:
        taken = take(uri, LeaseTimes())  # the defaults a sweep uses
        answers.put(("took", taken.run_id, os.getpid(), taken.resumed))
        done.wait(120)  # still running while the others decide
        taken.lease.release()
    except LeaseHeld as held:
        answers.put(("refused", held.run_id, held.owner.pid if held.owner else 0, None))


def _race(uri: str, delays: list[float]) -> list[tuple]:
    """Rivals taking this sweep's parent at once (forked: MLflow imported already), each `delay` after the barrier."""
    fork = multiprocessing.get_context("fork")
    barrier, answers, done = fork.Barrier(len(delays)), fork.Queue(), fork.Event()
    procs = [fork.Process(target=_rival, args=(uri, barrier, answers, done, d)) for d in delays]
    for proc in procs:
        proc.start()
    found = [answers.get(timeout=120) for _ in procs]
    done.set()
    for proc in procs:
        proc.join(timeout=30)
    return found


def _one_took_the_others_refused_naming_it(found: list[tuple]) -> tuple:
    took = [f for f in found if f[0] == "took"]
    assert len(took) == 1, found
    _, run_id, pid, _ = took[0]
    assert all(f[1:3] == (run_id, pid) for f in found if f[0] == "refused"), found
    return took[0]


@spawns
@pytest.mark.parametrize("delays", [[0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.5]], ids=["2-at-once", "3-at-once", "0.5s"])
def test_rivals_finding_no_parent_leave_one_parent(uri, delays):
    _run_in_child(_make_experiment, uri)  # the experiment exists; this process keeps off the store until the end
    _, run_id, _, resumed = _one_took_the_others_refused_naming_it(_race(uri, delays))
    assert resumed is False
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("kvsweep").experiment_id
    query = f"tags.`kvsweep.sweep_key` = '{KEY}'"
    assert [r.info.run_id for r in client.search_runs([experiment], query)] == [run_id]  # the others deleted theirs
    created = client.search_runs([experiment], query, run_view_type=ViewType.ALL)
    assert {r.info.lifecycle_stage for r in created if r.info.run_id != run_id} <= {"deleted"}


@spawns
def test_rivals_resuming_one_parent_at_once_leave_one_holder(uri):
    parent = _run_in_child(_make_parent, uri)  # a finished sweep's parent, its lease released
    _, run_id, _, resumed = _one_took_the_others_refused_naming_it(_race(uri, [0.0, 0.0]))
    assert (run_id, resumed) == (parent, True)


def _make_experiment(uri: str, answers) -> None:
    answers.put(SweepTracker(uri, "kvsweep").experiment_id)


def _make_parent(uri: str, answers) -> None:
    taken = take(uri)
    taken.lease.release()
    answers.put(taken.run_id)


def _run_in_child(target, uri: str):
    """Run `target` in a forked child: this process must not open the store before the rivals fork."""
    fork = multiprocessing.get_context("fork")
    answers = fork.Queue()
    proc = fork.Process(target=target, args=(uri, answers))
    proc.start()
    answer = answers.get(timeout=60)
    proc.join(timeout=30)
    return answer


def test_the_earliest_started_leased_parent_goes_on_and_a_slow_start_only_alone(uri):
    """The create race's rule on real runs: start time first, then the lowest run id; unleased parents are no rivals."""
    tracker = SweepTracker(uri, "kvsweep")
    leased = lease_tags(Owner.here())

    def parent(start_time: int, tags: dict[str, str]) -> str:
        run = tracker.client.create_run(
            tracker.experiment_id,
            start_time=start_time,
            tags={"kvsweep.role": "sweep", "kvsweep.sweep_key": KEY, **tags},
        )
        return run.info.run_id

    late, early_a, early_b = parent(2000, leased), parent(1000, leased), parent(1000, leased)
    unleased = parent(500, {})  # e.g. one `sync` made: it writes no cells of a live sweep
    runs = tracker.sweep_runs(KEY)
    earliest, other_early = sorted((early_a, early_b))
    assert [goes_on(runs, mine, prompt=True) for mine in (earliest, other_early, late)] == [True, False, False]
    assert not goes_on(runs, earliest, prompt=False)  # slow, with rivals: withdraws
    assert goes_on([r for r in runs if r.info.run_id in (late, unleased)], late, prompt=False)  # slow but alone


def test_the_lease_seam_is_checked_like_any_key():
    assert seams_from({"lease": {"period_s": 3, "by_pid": False}}).lease == {"period_s": 3, "by_pid": False}
    with pytest.raises(ConfigError, match=r"testing\.lease\.period: unknown key"):
        seams_from({"lease": {"period": 3}})
    with pytest.raises(ConfigError, match=r"testing\.lease\.by_pid"):
        seams_from({"lease": {"by_pid": 1}})


@spawns
def test_a_holder_stopped_past_its_lease_gives_the_parent_up_when_it_goes_on(uri):
    """A holder process frozen (SIGSTOP) past its 2 s lease; a rival from elsewhere takes the parent. Continued,
    the holder's next beat finds the rival's tags: it writes nothing more, and `ensure` refuses naming the rival."""
    holder = subprocess.Popen([sys.executable, "-c", LOSING_HOLDER, uri, KEY], stdout=subprocess.PIPE, text=True)
    parent = holder.stdout.readline().strip()
    assert parent, "the holder ended before it held a parent"
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        taken = take(uri, ELSEWHERE)
        assert (taken.run_id, taken.resumed) == (parent, True)
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    try:
        out, _ = holder.communicate(timeout=60)
        assert out.startswith("LeaseLost ") and f"host {socket.gethostname()} (pid {os.getpid()})" in out, out
        time.sleep(3 * ELSEWHERE.beat_s)
        owner = Owner.parse(lease_tags_of(uri, parent)["kvsweep.lease_owner"])
        assert owner is not None and owner.pid == os.getpid() and taken.lease.lost is None  # still the rival's
    finally:
        taken.lease.release()


def test_a_live_holder_overrules_a_claim_in_progress_and_gives_way_to_one_read_back(uri):
    """Another's tags still being claimed (count #0) over a holder that renews every 0.2 s: that claim cannot have
    judged the lease stale, and the holder writes over it (the claim's read-back then fails). Another's tags
    renewed (#1: its claimant read them back and holds them): the holder has lost the lease and says whose."""
    taken = take(uri, ELSEWHERE)
    rival = Owner("gpu-7", 9121, "feedface", "")
    client = MlflowClient(uri)
    try:
        write(client, taken.run_id, lease_tags(rival, 0))
        time.sleep(5 * ELSEWHERE.beat_s)
        assert Owner.parse(lease_tags_of(uri, taken.run_id)["kvsweep.lease_owner"]) == taken.lease.owner
        taken.lease.ensure()  # still ours
        write(client, taken.run_id, lease_tags(rival, 1))
        time.sleep(5 * ELSEWHERE.beat_s)
        assert Owner.parse(lease_tags_of(uri, taken.run_id)["kvsweep.lease_owner"]) == rival  # not taken back
        with pytest.raises(LeaseLost) as lost:
            taken.lease.ensure()
        assert "host gpu-7 (pid 9121)" in str(lost.value) and taken.run_id in str(lost.value)
    finally:
        taken.lease.release()
    assert Owner.parse(lease_tags_of(uri, taken.run_id)["kvsweep.lease_owner"]) == rival  # a lost lease: left alone


@pytest.mark.parametrize("holder", ["this sweep", "another sweep", "nobody"])
def test_sync_ends_a_parent_only_where_no_other_sweep_holds_it(uri, tmp_path, holder):
    """A journal whose sweep ended but never reached MLflow's end (it was cut off): `sync` ends its parent when the
    lease left on it is its own or none, and leaves it running when another sweep took it meanwhile."""
    from kvsweep.tracking.journal import Journal, sync_journal

    mine, rival = Owner("gpu-3", 41872, "aaaa", ""), Owner("gpu-7", 9121, "bbbb", "")
    tags = {"this sweep": lease_tags(mine, 5), "another sweep": lease_tags(rival, 5), "nobody": {}}[holder]
    tracker = SweepTracker(uri, "kvsweep")
    parent = tracker.create_parent("lease", KEY, tags)
    journal = Journal(tmp_path / "run")
    journal.write_header(header(uri))
    journal.write_parent(parent, mine.tag())
    journal.write_end("FINISHED", {"ok": 0})
    sync_journal(journal.path, uri)
    status = MlflowClient(uri).get_run(parent).info.status
    assert status == ("RUNNING" if holder == "another sweep" else "FINISHED")
