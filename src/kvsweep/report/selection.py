"""The selection table: per model/dtype/batch/context, which strategy to ship, decided from the data.

For each group of cells differing only in cache strategy: the *pick* is the lowest `rank_by` (TPOT by default)
among strategies that ran and fit when its 95% interval is apart from the runner-up's; otherwise, among those
*tied within noise*, the least memory, then the simpler strategy (registry order: `dynamic` first). *Leanest*: the
least memory within `max_slowdown` of the fastest median. Costs are relative to `dynamic`; failures get rollback
advice (`report/advice.py`). `quality_gate.py` decides eligibility: a refused strategy is never picked.
"""

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvsweep.caches import BASELINE, cache_rank
from kvsweep.config.schema import RANK_BY, ReportConfig
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, strategy_label
from kvsweep.measure.statistics import CiBounds, metric_interval, overlaps, ratio_error
from kvsweep.model_names import display_names
from kvsweep.names import Metric, ResultTag
from kvsweep.report.advice import failure_advice, slow_quantized_advice
from kvsweep.report.grouping import GroupKey, group_key, mix_of, mix_references, ranked_metric
from kvsweep.report.quality_gate import UNINFORMATIVE, Gate, gate_tags, judge
from kvsweep.results import OK, CellResult

TIE_RULE = "tie broken by least memory, then the simpler strategy"
MEMORY_LABELS = {Metric.PEAK_DEVICE_MEM_BYTES: "peak GPU memory", Metric.KV_CACHE_BYTES: "KV cache memory"}
TIMING_LABELS = {metric: metric.removesuffix("_ms").upper() for metric in RANK_BY}  # TPOT, TTFT, E2E
TIMING_LABELS |= {f"{metric}_p90": f"{label} p90" for metric, label in TIMING_LABELS.items()}  # a workload's rank
_DEFAULTS = ReportConfig()  # the schema's `report` section: every default below is read from it


@dataclass(frozen=True)
class Settings:
    """The selection's settings: the schema's `report` keys that decide picks (`gpu_hour_cost` is capacity's)."""

    rank_by: str = _DEFAULTS.rank_by  # one of `RANK_BY`
    max_slowdown: float = _DEFAULTS.max_slowdown
    min_token_agreement: float = _DEFAULTS.min_token_agreement  # below it: flagged, never deciding alone
    max_accuracy_drop: float = _DEFAULTS.max_accuracy_drop  # accuracy below dynamic's by more, intervals apart: refused
    max_kl: float = _DEFAULTS.max_kl  # mean teacher-forced KL from dynamic (nats) above it: refused if no task judges

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> "Settings":
        """From the config's `report` section or the parent run's `report.*` params (strings); missing: defaults."""
        defaults = cls()
        return cls(
            rank_by=str(values.get("rank_by", defaults.rank_by)),
            max_slowdown=float(values.get("max_slowdown", defaults.max_slowdown)),
            min_token_agreement=float(values.get("min_token_agreement", defaults.min_token_agreement)),
            max_accuracy_drop=float(values.get("max_accuracy_drop", defaults.max_accuracy_drop)),
            max_kl=float(values.get("max_kl", defaults.max_kl)),
        )


@dataclass
class Entry:
    """One strategy within a group."""

    label: str
    result: CellResult
    speed: float | None = None
    memory: float | None = None
    deltas: dict[str, float] = field(default_factory=dict)  # fraction vs dynamic: tpot, ttft, rank_by, memory
    errors: dict[str, float] = field(default_factory=dict)  # +- on those fractions (timings only)
    interval: CiBounds | None = None  # 95% interval of the rank_by median
    contention: str = ""  # what was seen, when the cell was measured under contention
    flags: list[str] = field(default_factory=list)
    advice: str = ""
    eligible: bool = False
    gate: Gate = field(default_factory=Gate)  # the quality verdict (cells that ran)

    @property
    def status(self) -> str:
        return self.result.status


@dataclass
class Decision:
    key: GroupKey  # the model's full reference
    entries: list[Entry]
    memory_basis: str
    settings: Settings
    pick: Entry | None = None  # the fastest when nothing ties with it, else the tie-break among the tied
    leanest: Entry | None = None
    tied: list[Entry] = field(default_factory=list)  # strategies indistinguishable from the fastest median
    model_name: str = ""  # what a person reads (model_names.py); the key keeps the full reference

    @property
    def label(self) -> str:
        model, dtype, batch, context, new, _, workload, serving = self.key
        if workload:
            return f"{self.model_name or model} {dtype} {workload} {serving} bs{batch} (p90 over requests)"
        return f"{self.model_name or model} {dtype} bs{batch} ctx{context} new{new}"

    def summary(self) -> str:
        """One line: the two picks and what they cost against dynamic."""
        if self.pick is None:
            return f"{self.label}: no strategy ran ({', '.join(f'{e.label} {e.status}' for e in self.entries)})"
        text = f"{self.label}: {self._pick_text()}"
        within = f"{self.settings.max_slowdown:.0%}"
        if self.leanest is not None and self.leanest is not self.pick:
            cost = _vs(self.leanest, first=True) or "the baseline"
            text += f"; leanest within {within}: {self.leanest.label} ({cost})"
        elif self.leanest is self.pick:
            text += f"; also the leanest within {within}"
        refused = [f"{e.label} ({'; '.join(e.gate.refusals)})" for e in self.refused()]
        if refused:
            text += f"; refused: {', '.join(refused)}"
        if self.uninformative:
            text += f"; {self.uninformative}"
        drifted = [f"{e.label} {flag}" for e in self.entries if e.status == OK for flag in e.gate.drift]
        if drifted:
            text += f"; flagged: {', '.join(drifted)}"
        contended = [e for e in self.deciding() if e.contention]
        if contended:
            text += f"; CONTENDED deciding cells: {', '.join(f'{e.label} ({e.contention})' for e in contended)}"
        return text

    def _pick_text(self) -> str:
        assert self.pick is not None
        metric = self.settings.rank_by.removesuffix("_ms")
        if not self.tied:
            return f"fastest {self.pick.label} ({metric} {self.pick.speed:.2f} ms{_vs(self.pick)})"
        speeds = [e.speed for e in self.tied if e.speed is not None]
        return (
            f"tied within noise on {metric} ({min(speeds):.2f}-{max(speeds):.2f} ms): "
            f"{', '.join(e.label for e in self.tied)}; pick {self.pick.label} ({TIE_RULE}{_vs(self.pick)})"
        )

    @property
    def uninformative(self) -> str:
        """'passkey uninformative at ctx 2048: dynamic 0.31 [0.11-0.59]' when the group's task judged nothing."""
        standings = [e.gate.standing for e in self.entries if e.status == OK]
        return next((s.why for s in standings if s.kind == UNINFORMATIVE), "")

    @property
    def dynamic_failed_task(self) -> bool:
        """Whether dynamic ran here and failed its own task (not merely: no dynamic cell to judge by)."""
        return any(
            e.label == BASELINE and e.status == OK and e.gate.standing.kind == UNINFORMATIVE for e in self.entries
        )

    def refused(self) -> list[Entry]:
        """Strategies that ran but that quality keeps from being picked."""
        return [e for e in self.entries if e.status == OK and e.gate.refused]

    def deciding(self) -> list[Entry]:
        """The cells the decision rests on: the fastest and its runner-up (or all the tied), and dynamic."""
        eligible = sorted((e for e in self.entries if e.eligible), key=lambda e: e.speed or 0.0)
        cells = self.tied or eligible[:2]
        dynamic = [e for e in self.entries if e.label == BASELINE and e.status == OK and e not in cells]
        return [*cells, *dynamic]


def quality_loss_tags(decisions: Iterable[Decision]) -> dict[str, dict[str, str]]:
    """Cell id -> its `kvsweep.task` and (with a task verdict) `kvsweep.quality_loss` tags, for every cell
    that ran (MLflow's copy of the gate)."""
    return {e.result.cell_id: gate_tags(e.gate) for d in decisions for e in d.entries if e.status == OK}


def _vs(entry: Entry, first: bool = False) -> str:
    parts = cost_text(entry)
    if not parts:
        return ""
    return ("" if first else "; ") + parts + " vs dynamic"


def cost_text(entry: Entry) -> str:
    """'TPOT -12%, TTFT +3%, memory +30%' relative to dynamic; empty for dynamic itself."""
    names = {**TIMING_LABELS, "memory": "memory"}
    return ", ".join(f"{names[k]} {pct(v)}{_pm(entry.errors.get(k))}" for k, v in entry.deltas.items())


def _pm(error: float | None) -> str:
    return "" if error is None else f" ±{error * 100:.0f}%"


def pct(fraction: float) -> str:
    return f"{fraction * 100:+.0f}%"


def memory_basis(results: Iterable[CellResult]) -> str:
    """GPU peaks when the sweep ran on GPUs; otherwise the cache's own bytes (a CPU process's RSS is mostly itself)."""
    on_gpu = any(Metric.PEAK_DEVICE_MEM_BYTES in r.metrics for r in results if r.status == OK)
    return Metric.PEAK_DEVICE_MEM_BYTES if on_gpu else Metric.KV_CACHE_BYTES


def decide(results: list[CellResult], settings: Settings) -> list[Decision]:
    basis = memory_basis(results)
    groups: dict[GroupKey, list[CellResult]] = defaultdict(list)
    for result in results:
        groups[group_key(result)].append(result)
    names = display_names(key[0] for key in groups)
    mixes = mix_references(results)
    decisions = [_decide_group(key, groups[key], basis, settings, mixes.get(mix_of(key))) for key in sorted(groups)]
    for decision in decisions:  # quantized weights are part of what is chosen for: they follow the name
        weights = decision.key[5]
        decision.model_name = names[decision.key[0]] + ("" if weights == NO_WEIGHT_QUANTIZATION else f" {weights}")
    return decisions


def _order(result: CellResult) -> tuple:
    return (*cache_rank(result.cell.cache), result.cell.compile)


def _decide_group(
    key: GroupKey, results: list[CellResult], basis: str, settings: Settings, mix_dynamic: CellResult | None = None
) -> Decision:
    """`mix_dynamic`: the mix's dynamic cell judging quality where the group has none (`grouping.py`)."""
    ordered = sorted(results, key=_order)
    baseline = next((r for r in ordered if strategy_label(r.cell) == BASELINE and r.status == OK), None)
    entries = [_entry(r, basis, settings, baseline or mix_dynamic) for r in ordered]
    dynamic = next((e for e in entries if e.result is baseline), None)
    for entry in entries:
        if entry.status == OK and dynamic is not None and entry is not dynamic:
            ranked = ranked_metric(entry.result, settings.rank_by)  # a workload's p90: what it was ranked by
            entry.deltas = _deltas(entry.result, dynamic.result, basis, ranked)
            entry.errors = _errors(entry.result, dynamic.result, ranked)
            slower = entry.deltas.get(ranked, 0.0) > 0
            entry.advice = entry.advice or slow_quantized_advice(entry.result.cell.cache, slower, True)
    decision = Decision(key, entries, basis, settings)
    eligible = sorted((e for e in entries if e.eligible), key=lambda e: e.speed)
    if eligible:
        best = eligible[0]
        tied = [e for e in eligible if e is best or overlaps(e.interval, best.interval)]
        decision.pick = best
        if len(tied) > 1:
            decision.tied = tied
            decision.pick = min(tied, key=lambda e: (math.inf if e.memory is None else e.memory, _order(e.result)))
        limit = best.speed * (1 + settings.max_slowdown)
        within = [e for e in eligible if e.speed <= limit and e.memory is not None]
        if within:
            decision.leanest = min(within, key=lambda e: (e.memory, e.speed))
    return decision


def _entry(result: CellResult, basis: str, settings: Settings, dynamic: CellResult | None) -> Entry:
    entry = Entry(strategy_label(result.cell), result)
    m = result.metrics
    if result.status != OK:
        entry.advice = failure_advice(result.cell.cache, bool(result.cell.compile), result.status, result.error)
        if result.tags.get(ResultTag.INFERRED) == "true":
            entry.flags.append("inferred from a smaller cell's OOM")
        return entry
    entry.speed = m.get(ranked_metric(result, settings.rank_by))
    entry.interval = metric_interval(m, ranked_metric(result, settings.rank_by))
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


def _timings(rank_by: str) -> list[str]:
    """The timings a cost is given in: TPOT and TTFT always, and the one the pick is ranked by."""
    return [Metric.TPOT_MS, Metric.TTFT_MS, *([rank_by] if rank_by not in (Metric.TPOT_MS, Metric.TTFT_MS) else [])]


def _errors(result: CellResult, dynamic: CellResult, rank_by: str) -> dict[str, float]:
    errors = {name: ratio_error(result.metrics, dynamic.metrics, name) for name in _timings(rank_by)}
    return {name: error for name, error in errors.items() if error is not None}


def _deltas(result: CellResult, dynamic: CellResult, basis: str, rank_by: str) -> dict[str, float]:
    out = {}
    for name, metric in [*((t, t) for t in _timings(rank_by)), ("memory", basis)]:
        mine, theirs = result.metrics.get(metric), dynamic.metrics.get(metric)
        if mine is not None and theirs:
            out[name] = mine / theirs - 1
    return out
