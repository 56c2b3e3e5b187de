"""A running sweep's lease on its parent run, kept in the run's tags so it works on any MLflow store.

MLflow has no compare-and-set and no server-side time for a tag, so no timestamps are compared between machines.
The owner reads both tags every `beat_s` and, while they are still its own, rewrites them; a reader calls the lease
live as soon as they change, and stale once they stayed the same for `period_s` on its own monotonic clock. A claim
writes, waits and reads back: it holds the lease only if nobody wrote since (Fischer's mutual exclusion). An owner
that finds another's tags has lost the lease (it was stopped or cut off for a whole period) and sends nothing more
(`Lease.ensure`, before every send; the timing argument and its conditions: docs/reliability.md).

The owner is named by host, pid, a random token and its kernel identity (boot id, pid namespace, start time), so a
reader on the same kernel and namespace tells at once whether it still runs (a dead or reused pid is a dead owner);
elsewhere it watches the heartbeat. MLflow is imported only where it writes: the driver imports `LeaseHeld` first.
"""

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from kvsweep.names import RunTag


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    token: str  # tells two owners apart where host and pid are the same (a pid reused, two leases in one process)
    process: str = ""  # "<boot id>/<pid namespace>/<start time>": empty where /proc cannot say

    @classmethod
    def here(cls) -> "Owner":
        """This process, with a token of its own."""
        return cls(socket.gethostname(), os.getpid(), secrets.token_hex(8), process_identity(os.getpid()))

    def tag(self) -> str:
        return f"host={self.host} pid={self.pid} token={self.token} process={self.process}"

    @classmethod
    def parse(cls, text: str) -> "Owner | None":
        """The owner a tag names; None for a tag kvsweep did not write."""
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        try:
            return cls(fields["host"], int(fields["pid"]), fields["token"], fields.get("process", ""))
        except (KeyError, ValueError):
            return None

    def alive_here(self) -> bool | None:
        """True/False where this process shares the owner's kernel and pid namespace; None where it cannot tell."""
        here = process_identity(os.getpid())
        if not self.process or not here or here.rsplit("/", 1)[0] != self.process.rsplit("/", 1)[0]:
            return None
        return process_identity(self.pid) == self.process


def process_identity(pid: int) -> str:
    """`<boot id>/<pid namespace>/<start time>` of a running process ("" where it is gone, a zombie, or no /proc).

    The start time (clock ticks since boot) tells a process from a later one that got its pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and parentheses
    state, started = fields[0], fields[19]
    if state in ("Z", "X"):  # killed, not yet reaped: dead
        return ""
    return f"{boot}/{namespace}/{started}"


class LeaseHeld(Exception):
    """Another live sweep writes to the parent run this sweep would resume: refused, exit 2."""

    def __init__(self, sweep: str, run_id: str, owner: Owner | None, why: str = "") -> None:
        self.sweep, self.run_id, self.owner, self.why = sweep, run_id, owner, why
        super().__init__(str(self))

    def __str__(self) -> str:
        who = f"on host {self.owner.host} (pid {self.owner.pid})" if self.owner else "elsewhere"
        parent = f", writing to parent run {self.run_id}" if self.run_id else ""
        why = f" ({self.why})" if self.why else ""
        return (
            f"sweep {self.sweep} is already running {who}{parent}{why}; "
            "not measuring its cells twice: run the same command again once it ends to resume, "
            "or add rerun=true to start a parent run of its own"
        )


RELEASE_WAIT_S = 5.0  # how long release waits for a beat in flight (an HTTP request) before clearing the tags


@dataclass(frozen=True)
class LeaseTimes:
    beat_s: float = 1.0  # the owner rewrites its lease this often
    period_s: float = 30.0  # tags unchanged this long, watched from one clock: the owner is gone
    window_s: float = 1.0  # a claim whose read-to-write took longer is slow: it waits longer, or backs off
    by_pid: bool = True  # an owner on this kernel is judged by its process at once (off: watched, as from elsewhere)

    @property
    def settle_s(self) -> float:
        """How long a prompt claim waits before reading back: longer than any prompt rival's read-to-write."""
        return self.window_s * 1.2

    @property
    def slow_settle_s(self) -> float:
        """A slow claim waits past the next beat of an owner it may have overwritten (its beats undo that)."""
        return self.beat_s * 3


class Verdict(Enum):
    FREE = "free"  # no lease: the last sweep released it
    STALE = "stale"  # its owner is dead (process gone, or no beat for a whole period)
    LIVE = "live"  # another sweep writes to this parent now
    GONE = "gone"  # the run was deleted meanwhile (a sweep that lost a start race): look again


@dataclass(frozen=True)
class Seen:
    """The lease as one read found it."""

    active: bool  # the run is not deleted
    owner_tag: str
    beat: str
    read_at: float  # monotonic time the read was sent

    @property
    def owner(self) -> Owner | None:
        return Owner.parse(self.owner_tag) if self.owner_tag else None

    def same_as(self, other: "Seen") -> bool:
        return (self.active, self.owner_tag, self.beat) == (other.active, other.owner_tag, other.beat)


def read(client: Any, run_id: str) -> Seen:
    sent = time.monotonic()
    run = client.get_run(run_id)
    tags = run.data.tags
    active = run.info.lifecycle_stage == "active"
    return Seen(active, tags.get(RunTag.LEASE_OWNER, ""), tags.get(RunTag.LEASE_HEARTBEAT, ""), sent)


def lease_tags(owner: Owner, beat: int = 0) -> dict[str, str]:
    """The lease's two tags; the beat counts up, so every renewal changes them."""
    return {RunTag.LEASE_OWNER: owner.tag(), RunTag.LEASE_HEARTBEAT: f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} #{beat}"}


def write(client: Any, run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag as Tag

    client.log_batch(run_id, tags=[Tag(k, v) for k, v in tags.items()])  # one request: both tags or neither


def judge(
    client: Any, run_id: str, times: LeaseTimes, watching: Callable[[Owner | None], None]
) -> tuple[Verdict, Seen]:
    """Whether the lease on `run_id` is held by a live sweep; also the last read (a claim starts from it).

    A lease still being taken (count 0: its claimant has not read it back) is watched until it is renewed,
    so that a refusal names the sweep that goes on, not a rival about to back off. `watching(owner)` is told
    before the lease of an owner elsewhere is watched for up to `period_s`."""
    first = now = read(client, run_id)
    since, changed, told = time.monotonic(), False, False
    while True:
        if not now.active:
            return Verdict.GONE, now
        if not now.owner_tag:
            return Verdict.FREE, now
        alive = now.owner.alive_here() if now.owner and times.by_pid else None
        if alive is False:
            return Verdict.STALE, now
        changed = changed or not now.same_as(first)  # written meanwhile: somebody is at it
        if (alive or changed) and renewed(now):
            return Verdict.LIVE, now
        if now.read_at - since >= times.period_s:  # not renewed once while watched
            return (Verdict.LIVE if alive or changed else Verdict.STALE), now
        if alive is None and not told:
            watching(now.owner)
            told = True
        time.sleep(times.beat_s)
        now = read(client, run_id)


def renewed(seen: Seen) -> bool:
    """The holder has renewed its lease at least once: it read its claim back and holds it."""
    count = seen.beat.rpartition("#")[2]
    return count.isdigit() and int(count) > 0


def claim(client: Any, run_id: str, owner: Owner, times: LeaseTimes, last_read: Seen) -> bool:
    """Take a free or stale lease, seen last in `last_read`: whether it is ours (nobody wrote it since)."""
    tags = lease_tags(owner)
    write(client, run_id, tags)
    prompt = time.monotonic() - last_read.read_at <= times.window_s
    time.sleep(times.settle_s if prompt else times.slow_settle_s)
    now = read(client, run_id)
    return now.active and (now.owner_tag, now.beat) == (tags[RunTag.LEASE_OWNER], tags[RunTag.LEASE_HEARTBEAT])


class LeaseLost(Exception):
    """This sweep's lease was taken while it could not renew it (its process stopped, or cut off from MLflow for
    longer than the lease): another sweep now writes to the parent, so this one stops before it sends anything."""

    def __init__(self, run_id: str, owner: Owner | None, period_s: float) -> None:
        self.run_id, self.owner, self.period_s = run_id, owner, period_s
        super().__init__(str(self))

    def __str__(self) -> str:
        who = f"host {self.owner.host} (pid {self.owner.pid})" if self.owner else "another sweep"
        return (
            f"parent run {self.run_id} now belongs to {who}: this sweep could not renew its lease for more than "
            f"{self.period_s:g} s (stopped, or cut off from MLflow), so it stops here and sends nothing more"
        )


class Lease:
    """This sweep's hold on its parent run: renewed by a background thread until released or lost.

    A renewal reads the tags first and writes only while they are still this sweep's own: an owner that was
    stopped or cut off past `period_s` finds a rival's tags, stops renewing and is `lost` instead of taking the
    parent back. The sink calls `ensure()` before every send; a send long after the last renewal (the whole
    process was stopped, beat thread included) renews first, and writes nothing if the lease has gone."""

    def __init__(self, client: Any, run_id: str, owner: Owner, times: LeaseTimes) -> None:
        self.client, self.run_id, self.owner, self.times = client, run_id, owner, times
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one renewal at a time: the beat thread's, or a send's
        self._beat_count = 1
        self._renewed_at = time.monotonic()  # the claim read its tags back just now
        self._thread = threading.Thread(target=self._beat, name="kvsweep-lease", daemon=True)

    def start(self) -> "Lease":
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.times.beat_s):
            with contextlib.suppress(Exception):  # MLflow away a moment: the next beat tries again (period_s)
                self._renew()
            if self.lost is not None:
                return

    def _renew(self) -> None:
        """Read the tags and write the next beat while they are ours; raises when MLflow cannot be reached.

        Another's tags mean the lease is lost, with one exception: a claim still being taken (count `#0`) over
        a holder that renewed within half a period cannot have judged it stale (a claim waits a whole period
        without renewals); it is a rival that read the lease free a moment before, and the holder writes over
        it, which that claim's read-back sees (it backs off). A holder back from longer away gives way."""
        with self._lock:
            if self.lost is not None:
                return
            seen = read(self.client, self.run_id)
            away_s = seen.read_at - self._renewed_at
            mine = seen.owner_tag == self.owner.tag()
            overrules = not renewed(seen) and away_s < self.times.period_s / 2
            if not seen.active or not (mine or overrules):
                self.lost = LeaseLost(self.run_id, seen.owner, self.times.period_s)
                return
            sent = time.monotonic()
            write(self.client, self.run_id, lease_tags(self.owner, self._beat_count))
            self._beat_count += 1
            self._renewed_at = sent

    def ensure(self) -> None:
        """Before a send: raises `LeaseLost` if the parent is another sweep's now. A lease renewed within half a
        period is ours (a rival takes one only after a whole period without renewals); an older one is renewed
        here first. Raises MLflow's error when it cannot be reached (the sink keeps the result and retries)."""
        if self.lost is None and time.monotonic() - self._renewed_at >= self.times.period_s / 2:
            self._renew()
        if self.lost is not None:
            raise self.lost

    def release(self) -> None:
        """Stop renewing and clear the tags if they are still ours (best effort: if MLflow cannot be reached,
        the lease expires by itself)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(RELEASE_WAIT_S)
        if self.lost is not None:
            return
        try:
            if read(self.client, self.run_id).owner_tag != self.owner.tag():
                return
            for key in (RunTag.LEASE_OWNER, RunTag.LEASE_HEARTBEAT):
                self.client.delete_tag(self.run_id, key)
        except Exception:
            pass
