"""Who else used this cell's CPUs while a call was measured, and the cell's one contention verdict.

A cell on a shared host is slowed by anything else on its CPUs: another job, a spare actor importing, kvsweep's
own driver, or the hypervisor giving the vCPU to another guest (steal). `/proc/stat`'s per-CPU counters less this
process's own CPU time (all threads) leave what others took, read around every measured call so each call carries
its own evidence. They count USER_HZ ticks (10 ms), good to about one tick per CPU: a call counts as contended only
when its share exceeds the limit by more than that `resolution` (a 20 ms call cannot tell 0.3 from 0).

The verdict joins the host's CPUs and, on CUDA, the GPU: `unknown` when some evidence could not be read and none
says disturbed, `false` only when everything was read and clean (tags: docs/measurement.md).
"""

import math
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvsweep.measure.gpu_sharing import ALONE, CONTENDED, UNKNOWN
from kvsweep.names import Metric

PROC_STAT = "/proc/stat"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# /proc/stat per-CPU fields: user nice system idle iowait irq softirq steal guest guest_nice
# (guest time is already inside user/nice, so it is not added again)
_BUSY, _STEAL = (0, 1, 2, 5, 6), 7


@dataclass(frozen=True)
class CpuCounters:
    """Seconds, summed over the CPUs read, since boot."""

    busy: float
    steal: float


@dataclass(frozen=True)
class CallContention:
    """What others took of the cell's CPUs during one call: CPU-seconds, and shares of (wall x CPUs)."""

    other_s: float
    steal_s: float
    capacity_s: float  # wall time x CPUs
    cpus: int

    @property
    def other_share(self) -> float:
        return min(1.0, max(0.0, self.other_s / self.capacity_s))

    @property
    def steal_share(self) -> float:
        return min(1.0, max(0.0, self.steal_s / self.capacity_s))

    @property
    def resolution(self) -> float:
        """One tick per CPU, as a share: the reading's own uncertainty."""
        return min(1.0, self.cpus * TICK_S / self.capacity_s)

    def over(self, limit: float) -> bool:
        """Contended beyond what the counters' resolution could explain."""
        return max(self.other_share, self.steal_share) - self.resolution > limit

    def to_dict(self) -> dict[str, float]:
        return {
            Metric.HOST_OTHER_CPU_SHARE: round(self.other_share, 4),
            Metric.HOST_STEAL_SHARE: round(self.steal_share, 4),
            "contention_resolution": round(self.resolution, 4),
        }


def read_counters(cpus: Iterable[int], path: str = PROC_STAT) -> CpuCounters | None:
    """Busy and steal seconds of the given CPUs, or None when the counters cannot be read."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = steal = 0
    found = 0
    try:
        with open(path) as stat:
            for line in stat:
                name, _, rest = line.partition(" ")
                if name in wanted:
                    fields = [int(v) for v in rest.split()]
                    busy += sum(fields[i] for i in _BUSY if i < len(fields))
                    steal += fields[_STEAL] if len(fields) > _STEAL else 0
                    found += 1
    except (OSError, ValueError):
        return None
    if found != len(wanted):
        return None
    return CpuCounters(busy * TICK_S, steal * TICK_S)


class HostMeter:
    """A call meter (`Meter[CallContention | None]`, `meter.py`): `start()` before the call, `stop()` after;
    `stop()` returns None when it cannot tell.

    `path` is the seam for a host without `/proc/stat`; `own_cpu` is this process's CPU time.
    """

    def __init__(
        self,
        cpus: Sequence[int] | None = None,
        path: str = PROC_STAT,
        own_cpu: Callable[[], float] = time.process_time,
    ) -> None:
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.path = path
        self.own_cpu = own_cpu
        self._start: tuple[float, float, CpuCounters | None] | None = None

    def start(self) -> None:
        self._start = (time.perf_counter(), self.own_cpu(), read_counters(self.cpus, self.path))

    def stop(self) -> CallContention | None:
        counters = read_counters(self.cpus, self.path)
        own, wall = self.own_cpu(), time.perf_counter()
        if self._start is None or self._start[2] is None or counters is None:
            return None
        began, own_before, before = self._start
        return CallContention(
            other_s=counters.busy - before.busy - (own - own_before),
            steal_s=counters.steal - before.steal,
            capacity_s=max(wall - began, TICK_S) * len(self.cpus),
            cpus=len(self.cpus),
        )


def pooled(readings: Sequence[CallContention]) -> tuple[float, float]:
    """Other and steal shares over all the calls together: each call's one-tick error shrinks with the total
    time, where a median of per-call shares keeps it (a 30 ms call cannot read better than +-0.3)."""
    capacity = sum(r.capacity_s for r in readings)
    other, steal = sum(r.other_s for r in readings), sum(r.steal_s for r in readings)
    return min(1.0, max(0.0, other / capacity)), min(1.0, max(0.0, steal / capacity))


@dataclass(frozen=True)
class HostEvidence:
    readings: Sequence[CallContention | None]  # one per kept call
    limit: float  # the share a kept call may lose to others
    niceness: int = 0

    @property
    def known(self) -> bool:
        return bool(self.readings) and all(r is not None for r in self.readings)

    def metrics(self) -> dict[str, float]:
        """Shares over the kept calls together (only when every call could be read)."""
        if not self.known:
            return {}
        other, steal = pooled([r for r in self.readings if r is not None])
        return {Metric.HOST_OTHER_CPU_SHARE: other, Metric.HOST_STEAL_SHARE: steal}

    def verdict(self) -> tuple[str, str]:
        """Contended when a kept call, or the kept calls together, lost more than the limit beyond what the
        counters' resolution explains."""
        if not self.known:
            return UNKNOWN, "host unknown (no /proc/stat)"
        readings = [r for r in self.readings if r is not None]
        other, steal = pooled(readings)
        text = f"host {other:.2f}, steal {steal:.2f}"
        # A niced process yields to anyone, so any other work beyond the counters' resolution disturbed it.
        limit = 0.0 if self.niceness > 0 else self.limit
        if self.niceness > 0:
            text += f", nice {self.niceness}"
        # Short calls read coarsely one by one; together their errors average out (sqrt of the count).
        together = math.sqrt(len(readings)) * readings[0].cpus * TICK_S / sum(r.capacity_s for r in readings)
        contended = any(r.over(limit) for r in readings) or max(other, steal) - together > limit
        return (CONTENDED if contended else ALONE), text


def merge(host: tuple[str, str], gpu: tuple[str, str] | None) -> tuple[str, str]:
    """Both verdicts in one: true wins, then unknown; the texts are joined."""
    verdicts = [host] + ([gpu] if gpu is not None else [])
    states = {v for v, _ in verdicts}
    state = CONTENDED if CONTENDED in states else UNKNOWN if UNKNOWN in states else ALONE
    return state, "; ".join(text for _, text in verdicts)


def gpu_verdict(state: str, seen_on: Mapping[str, Collection[int]]) -> tuple[str, str]:
    """The GPUs' verdict and what was seen: `gpu pids 1234`; a cell over several GPUs names the GPU each
    process was on (`gpu pids 1234 on GPU-b`), so a person can tell whose job sat on which."""
    if state != CONTENDED:
        return state, "gpu alone" if state == ALONE else "gpu unknown"
    if len(seen_on) <= 1:
        return state, "gpu pids " + ",".join(map(str, sorted(pid for pids in seen_on.values() for pid in pids)))
    found = [f"{','.join(map(str, sorted(pids)))} on {uuid}" for uuid, pids in seen_on.items() if pids]
    return state, "gpu pids " + ", ".join(found)
