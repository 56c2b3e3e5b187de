"""One strategy within a selection group: its ranked timing, memory, quality verdict, flags and advice."""

from dataclasses import dataclass, field

from kvsweep.grid import strategy_label
from kvsweep.measure.paired import PairedRatio
from kvsweep.measure.statistics import CiBounds
from kvsweep.names import Metric, ResultTag
from kvsweep.report.advice import failure_advice
from kvsweep.report.quality_gate import Gate, judge
from kvsweep.report.ranking import Ranking, ranked_interval
from kvsweep.report.selection_settings import Settings
from kvsweep.results import OK, CellResult


@dataclass
class Entry:
    """One strategy within a group."""

    label: str
    result: CellResult
    speed: float | None = None  # the ranked timing (ms)
    memory: float | None = None
    deltas: dict[str, float] = field(default_factory=dict)  # label -> fraction vs dynamic ('TTFT p90', 'memory')
    errors: dict[str, float] = field(default_factory=dict)  # +- on those fractions (a fixed shape's timings)
    paired: dict[str, PairedRatio] = field(default_factory=dict)  # timing -> per-request ratio to dynamic (workload)
    interval: CiBounds | None = None  # 95% interval of the ranked timing; None: it has none
    contention: str = ""  # what was seen, when the cell was measured under contention
    flags: list[str] = field(default_factory=list)
    advice: str = ""
    eligible: bool = False  # ran, kept its quality, plausible
    held_back: list[str] = field(default_factory=list)  # why an eligible entry is no candidate: slowdowns, SLOs
    tied_with_pick: bool = False  # held back, though tied with the pick on what is ranked
    gate: Gate = field(default_factory=Gate)  # the quality verdict (cells that ran)

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def candidate(self) -> bool:
        return self.eligible and not self.held_back


def make_entry(
    result: CellResult, basis: str, settings: Settings, dynamic: CellResult | None, ranking: Ranking
) -> Entry:
    entry = Entry(strategy_label(result.cell), result)
    m = result.metrics
    if result.status != OK:
        entry.advice = failure_advice(result.cell.cache, bool(result.cell.compile), result.status, result.error)
        if result.tags.get(ResultTag.INFERRED) == "true":
            entry.flags.append("inferred from a smaller cell's OOM")
        return entry
    entry.speed = m.get(ranking.metric)
    entry.interval = ranked_interval(result, ranking)
    entry.memory = m.get(basis)
    entry.gate = judge(
        result,
        dynamic,
        max_accuracy_drop=settings.max_accuracy_drop,
        max_kl=settings.max_kl,
        min_token_agreement=settings.min_token_agreement,
    )
    entry.flags += [*entry.gate.refusals, *entry.gate.flags]
    entry.advice = entry.gate.advice
    if ResultTag.QUALITY in result.tags:
        entry.flags.append(f"quality {result.tags[ResultTag.QUALITY]}")
    if result.tags.get(ResultTag.CONTENDED) == "true":
        entry.contention = result.tags.get(ResultTag.CONTENTION, "GPU shared")
        entry.flags.append(f"contended: {entry.contention}")
    implausible = result.tags.get(ResultTag.IMPLAUSIBLE) == "true"
    if implausible:
        utilization = m.get(Metric.DECODE_BANDWIDTH_UTILIZATION, float("nan"))
        entry.flags.append(f"implausible: decode read {utilization:.2f}x the memory bandwidth")
    entry.eligible = entry.speed is not None and not entry.gate.refused and not implausible
    return entry
