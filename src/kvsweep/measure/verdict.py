"""One contention verdict per cell from all the evidence: the host's CPUs and, on CUDA, the GPU.

`kvsweep.contended` is `true` when any evidence says the kept calls were disturbed, `unknown` when
some evidence could not be read and none says disturbed, `false` only when everything was read and
clean. `kvsweep.contention` says what was seen, so a person can judge (`host 0.62, steal 0.00;
gpu pids 1234`; on a cell over several GPUs, `gpu pids 1234 on GPU-...` names the GPU).
"""

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kvsweep.measure.contention import TICK_S, CallContention, pooled
from kvsweep.measure.gpu_sharing import ALONE, CONTENDED, UNKNOWN
from kvsweep.names import Metric


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
