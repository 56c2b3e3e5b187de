"""Each selection group's Pareto front over (ranked latency, memory, quality): the strategies nothing beats on all
three, the pick marked, for `pareto.csv` and the report.

A pick is one point on a trade-off; the front shows the others a user could defend instead (a leaner cache that
is slower, a faster one that is less accurate). Quality is the task accuracy where the group ran a task, else
absent (the front is then over latency and memory). Only strategies that ran and kept their quality are on it.
"""

import csv
import io
from dataclasses import dataclass

from kvsweep.report.selection import Decision, Entry
from kvsweep.report.task_accuracy import quality_score

HEADER = [
    "group",
    "strategy",
    "ranked_by",
    "latency_ms",
    "memory_basis",
    "memory_bytes",
    "quality_metric",
    "quality",
    "on_front",
    "pick",
]


@dataclass(frozen=True)
class FrontPoint:
    entry: Entry
    latency: float
    memory: float
    quality: float | None  # task accuracy; None without a task

    def dominates(self, other: "FrontPoint") -> bool:
        """No worse on every axis and better on one (lower latency and memory, higher quality)."""
        mine = (self.latency, self.memory, -(self.quality if self.quality is not None else 0.0))
        theirs = (other.latency, other.memory, -(other.quality if other.quality is not None else 0.0))
        return all(a <= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


def points(decision: Decision) -> list[FrontPoint]:
    """Every strategy of the group that ran with a ranked latency and a memory reading, and kept its quality."""
    found = []
    for e in decision.entries:
        if e.eligible and e.speed is not None and e.memory is not None:
            score = quality_score(e.result.metrics)
            found.append(FrontPoint(e, e.speed, e.memory, score[1] if score else None))
    return found


def front(decision: Decision) -> list[FrontPoint]:
    """The group's points that no other point dominates, fastest first."""
    candidates = points(decision)
    kept = [p for p in candidates if not any(q.dominates(p) for q in candidates if q is not p)]
    return sorted(kept, key=lambda p: (p.latency, p.memory))


def front_text(decision: Decision) -> str:
    """'Pareto front: static (8.80 ms, 1.2 MiB), quantized-hqq-int4 (9.50 ms, 0.3 MiB) *pick*'."""
    kept = front(decision)
    if len(kept) < 2:
        return ""
    parts = []
    for p in kept:
        quality = f", {p.quality:.2f}" if p.quality is not None else ""
        mark = " *pick*" if p.entry is decision.pick else ""
        parts.append(f"{p.entry.label} ({p.latency:.2f} ms, {p.memory / 2**20:.1f} MiB{quality}){mark}")
    return "Pareto front: " + ", ".join(parts)


def pareto_csv(decisions: list[Decision]) -> str:
    """One row per strategy that could be on a front (ran, kept its quality), with whether it is and the pick."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for decision in decisions:
        on_front = {id(p.entry) for p in front(decision)}
        for p in points(decision):
            score = quality_score(p.entry.result.metrics)
            writer.writerow(
                [
                    decision.label,
                    p.entry.label,
                    decision.ranking.metric,
                    f"{p.latency:.6g}",
                    decision.memory_basis,
                    f"{p.memory:.0f}",
                    score[0] if score else "",
                    "" if p.quality is None else f"{p.quality:.6g}",
                    str(id(p.entry) in on_front).lower(),
                    str(p.entry is decision.pick).lower(),
                ]
            )
    return out.getvalue()
