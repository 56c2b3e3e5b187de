"""The selection table: per model/dtype/batch/context (or workload), which strategy to ship, decided from the data.

For each group of cells differing only in cache strategy, the candidates are the strategies that ran, kept their
quality (`quality_gate.py`), read plausibly, are not slower than the group's reference (dynamic) beyond
`report.max_slowdown` on any latency not waived and meet the SLOs (`constraints.py`). Among them `report.objective`
decides: *latency* (default) the lowest ranked timing (`ranking.py`: a fixed shape's median, a workload's
percentile with an interval); *memory* the least memory; *throughput* the most tokens per second; *goodput* the
most requests per second within the SLOs. A best that cannot be told apart from others (intervals overlapping; a
paired test on a workload's requests) is *tied* with them, and the tie goes to the least memory, then the simpler
strategy (registry order: `dynamic` first). *Leanest*: the least memory among the candidates within
`max_slowdown` of the best. Costs are relative to `dynamic`; failures get rollback advice (`report/advice.py`).
"""

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsweep.caches import BASELINE, cache_rank
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, strategy_label
from kvsweep.model_names import display_names
from kvsweep.names import Metric
from kvsweep.report.advice import slow_quantized_advice
from kvsweep.report.constraints import beyond, slo_misses
from kvsweep.report.costs import cost_text, costs, paired_ratios, vs_dynamic
from kvsweep.report.grouping import GroupKey, group_key, mix_of, mix_references
from kvsweep.report.objective import MEMORY, OBJECTIVE_WORDS, memory_of, objective_key, objective_tie
from kvsweep.report.quality_gate import UNINFORMATIVE, gate_tags
from kvsweep.report.ranking import Ranking, group_ranking
from kvsweep.report.selection_entry import Entry, make_entry
from kvsweep.report.selection_settings import Settings
from kvsweep.results import OK, CellResult

__all__ = ["OBJECTIVE_WORDS", "Decision", "Entry", "Settings", "cost_text", "decide", "group_key", "memory_basis"]

TIE_RULE = "tie broken by least memory, then the simpler strategy"
MEMORY_LABELS = {Metric.PEAK_DEVICE_MEM_BYTES: "peak GPU memory", Metric.KV_CACHE_BYTES: "KV cache memory"}


@dataclass
class Decision:
    key: GroupKey  # the model's full reference
    entries: list[Entry]
    memory_basis: str
    settings: Settings
    ranking: Ranking = field(default_factory=lambda: Ranking(Metric.TPOT_MS, Metric.TPOT_MS, workload=False))
    pick: Entry | None = None  # the best by the objective when nothing ties with it, else the tie-break
    leanest: Entry | None = None
    tied: list[Entry] = field(default_factory=list)  # candidates indistinguishable from the best
    tie_test: str = ""  # what told the tie: independent intervals, paired sign test, McNemar, no interval
    model_name: str = ""  # what a person reads (model_names.py); the key keeps the full reference

    @property
    def label(self) -> str:
        model, dtype, batch, context, new, _, workload, serving, rate = self.key
        if workload:
            over = f"({self.ranking.short} over requests)"
            at = f"@{rate:g}rps" if rate else ""
            return f"{self.model_name or model} {dtype} {workload} {serving}{at} bs{batch} {over}"
        return f"{self.model_name or model} {dtype} bs{batch} ctx{context} new{new}"

    @property
    def alone(self) -> bool:
        """Only one strategy ran here: there is nothing to compare it with."""
        return sum(1 for e in self.entries if e.status == OK) == 1

    def summary(self) -> str:
        """One line: the two picks and what they cost against dynamic, and what kept others out."""
        if self.pick is None:
            held = self.held_back()
            if held:
                return f"{self.label}: no strategy meets the constraints ({'; '.join(held)})"
            return f"{self.label}: no strategy ran ({', '.join(f'{e.label} {e.status}' for e in self.entries)})"
        text = f"{self.label}: {self._pick_text()}"
        if self.ranking.note:
            text += f" [{self.ranking.note}]"
        within = f"{self.settings.max_slowdown:.0%}"
        if self.leanest is not None and self.leanest is not self.pick:
            cost = vs_dynamic(self.leanest, first=True) or "the baseline"
            text += f"; leanest within {within}: {self.leanest.label} ({cost})"
        elif self.leanest is self.pick and not self.alone:
            text += f"; also the leanest within {within}"
        held = self.held_back()
        if held:
            text += f"; not picked: {'; '.join(held)}"
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

    def held_back(self) -> list[str]:
        """'quantized-hqq-int4 (tied on tpot): TTFT +103% > 10%' for each eligible strategy the constraints kept
        out, saying when it was tied with the pick on what is ranked (the tie it would have won on memory)."""
        lines = []
        for e in self.entries:
            if e.eligible and e.held_back:
                tie = f" (tied on {self.ranking.short} with {self.pick.label})" if e.tied_with_pick else ""
                lines.append(f"{e.label}{tie}: {', '.join(e.held_back)}")
        return lines

    def _pick_text(self) -> str:
        assert self.pick is not None
        metric = self.ranking.short
        speed = f"{metric} {self.pick.speed:.2f} ms" if self.pick.speed is not None else metric
        if self.alone:
            return f"only {self.pick.label} ran here, nothing to compare it with ({speed})"
        best = OBJECTIVE_WORDS[self.settings.objective]
        if not self.tied:
            return f"{best} {self.pick.label} ({speed}{vs_dynamic(self.pick)})"
        speeds = [e.speed for e in self.tied if e.speed is not None]
        within = f" on {metric} ({min(speeds):.2f}-{max(speeds):.2f} ms)" if speeds else ""
        return (
            f"tied within noise{within}, {self.tie_test}: {', '.join(e.label for e in self.tied)}; "
            f"pick {self.pick.label} ({TIE_RULE}{vs_dynamic(self.pick)})"
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
        """The cells the decision rests on: the best and its runner-up (or all the tied), and dynamic."""
        ranked = sorted((e for e in self.entries if e.candidate), key=lambda e: e.speed or 0.0)
        cells = self.tied or ranked[:2]
        dynamic = [e for e in self.entries if e.label == BASELINE and e.status == OK and e not in cells]
        return [*cells, *dynamic]


def quality_loss_tags(decisions: Iterable[Decision]) -> dict[str, dict[str, str]]:
    """Cell id -> its `kvsweep.task` and (with a task verdict) `kvsweep.quality_loss` tags, for every cell
    that ran (MLflow's copy of the gate)."""
    return {e.result.cell_id: gate_tags(e.gate) for d in decisions for e in d.entries if e.status == OK}


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
    ranking = group_ranking(ordered, settings.rank_by)
    baseline = next((r for r in ordered if strategy_label(r.cell) == BASELINE and r.status == OK), None)
    entries = [make_entry(r, basis, settings, baseline or mix_dynamic, ranking) for r in ordered]
    dynamic = next((e for e in entries if e.result is baseline), None)
    for entry in entries:
        if entry.status == OK and dynamic is not None and entry is not dynamic:
            entry.deltas, entry.errors = costs(entry.result, dynamic.result, basis, ranking)
            entry.paired = paired_ratios(entry.result, dynamic.result) if ranking.workload else {}
            slower = (entry.speed or 0.0) > (dynamic.speed or math.inf)
            entry.advice = entry.advice or slow_quantized_advice(entry.result.cell.cache, slower, True)
        if entry.eligible:
            reference = dynamic.result if dynamic is not None else None
            entry.held_back = [
                *beyond(entry.result, reference, ranking, settings.max_slowdown, settings.waive_slowdown),
                *slo_misses(entry.result, ranking, settings.slo_ttft_ms, settings.slo_tpot_ms),
            ]
    decision = Decision(key, entries, basis, settings, ranking)
    candidates = sorted((e for e in entries if e.candidate), key=lambda e: objective_key(e, settings.objective))
    if candidates:
        best = candidates[0]
        decision.pick = best
        if settings.objective != MEMORY:
            found = [(e, *objective_tie(e, best, ranking, settings)) for e in candidates if e is not best]
            ties = [(e, test) for e, same, test in found if same]
            if ties:
                decision.tied, decision.tie_test = [best, *(e for e, _ in ties)], ties[0][1]
                decision.pick = min(decision.tied, key=lambda e: (memory_of(e), _order(e.result)))
        for entry in entries:  # a held-back strategy the pick is tied with: the tie it would have won on memory
            if entry.eligible and entry.held_back and decision.pick is not None and entry.speed is not None:
                entry.tied_with_pick = objective_tie(entry, decision.pick, ranking, settings)[0]
        fastest = min((e for e in candidates if e.speed is not None), key=lambda e: e.speed, default=None)
        if fastest is not None:
            limit = fastest.speed * (1 + settings.max_slowdown)
            within = [e for e in candidates if e.speed is not None and e.speed <= limit and e.memory is not None]
            if within:
                decision.leanest = min(within, key=lambda e: (e.memory, e.speed))
    return decision
