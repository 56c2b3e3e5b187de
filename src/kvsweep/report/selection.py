"""The selection table: per model/dtype/batch/context, which strategy to ship, decided from the data.

For every group of cells that differ only in their cache strategy:
- *fastest*: the lowest `rank_by` (TPOT by default) among strategies that ran and fit;
- *leanest*: the least memory among strategies within `max_slowdown` of the fastest;
- every strategy's cost relative to `dynamic` (TPOT, TTFT, memory), its quality flags, and for
  failures the status with the rollback advice of the domain brief.
A strategy whose tokens drift from dynamic (agreement below the threshold) is never picked for a
trained model; on random-weight presets (shape-only) quality says little, so it is only flagged.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvsweep.caches import CACHE_NAMES
from kvsweep.model_names import display_names
from kvsweep.report.advice import failure_advice, quality_advice, slow_quantized_advice
from kvsweep.results import OK, CellResult

GroupKey = tuple[str, str, int, int, int]  # model, dtype, batch size, context length, new tokens
MEMORY_LABELS = {"peak_device_mem_bytes": "peak GPU memory", "kv_cache_bytes": "KV cache memory"}


@dataclass(frozen=True)
class Settings:
    rank_by: str = "tpot_ms"
    max_slowdown: float = 0.10
    min_token_agreement: float = 0.9


@dataclass
class Entry:
    """One strategy within a group."""

    label: str
    result: CellResult
    speed: float | None = None
    memory: float | None = None
    deltas: dict[str, float] = field(default_factory=dict)  # fraction vs dynamic: tpot, ttft, memory
    flags: list[str] = field(default_factory=list)
    advice: str = ""
    eligible: bool = False

    @property
    def status(self) -> str:
        return self.result.status


@dataclass
class Decision:
    key: GroupKey  # the model's full reference
    entries: list[Entry]
    memory_basis: str
    settings: Settings
    fastest: Entry | None = None
    leanest: Entry | None = None
    model_name: str = ""  # what a person reads (model_names.py); the key keeps the full reference

    @property
    def label(self) -> str:
        model, dtype, batch, context, new = self.key
        return f"{self.model_name or model} {dtype} bs{batch} ctx{context} new{new}"

    def summary(self) -> str:
        """One line: the two picks and what they cost against dynamic."""
        if self.fastest is None:
            return f"{self.label}: no strategy ran ({', '.join(f'{e.label} {e.status}' for e in self.entries)})"
        speed = f"{self.settings.rank_by.removesuffix('_ms')} {self.fastest.speed:.2f} ms"
        text = f"{self.label}: fastest {self.fastest.label} ({speed}{_vs(self.fastest)})"
        within = f"{self.settings.max_slowdown:.0%}"
        if self.leanest is not None and self.leanest is not self.fastest:
            text += f"; leanest within {within}: {self.leanest.label} ({_vs(self.leanest, first=True)})"
        elif self.leanest is self.fastest:
            text += f"; also the leanest within {within}"
        drifted = [
            f"{e.label} {e.flags[0]}" for e in self.entries if e.status == OK and e.flags and "agreement" in e.flags[0]
        ]
        if drifted:
            text += f"; flagged: {', '.join(drifted)}"
        return text


def _vs(entry: Entry, first: bool = False) -> str:
    parts = cost_text(entry)
    if not parts:
        return ""
    return ("" if first else "; ") + parts + " vs dynamic"


def cost_text(entry: Entry) -> str:
    """'TPOT -12%, TTFT +3%, memory +30%' relative to dynamic; empty for dynamic itself."""
    names = {"tpot_ms": "TPOT", "ttft_ms": "TTFT", "memory": "memory"}
    return ", ".join(f"{names[k]} {pct(v)}" for k, v in entry.deltas.items())


def pct(fraction: float) -> str:
    return f"{fraction * 100:+.0f}%"


def strategy_label(result: CellResult) -> str:
    return result.cell["cache"] + ("+compile" if result.cell["compile"] else "")


def group_key(result: CellResult) -> GroupKey:
    c = result.cell
    return (str(c["model"]), str(c["dtype"]), int(c["batch_size"]), int(c["context_length"]), int(c["max_new_tokens"]))


def memory_basis(results: Iterable[CellResult]) -> str:
    """GPU peaks when the sweep ran on GPUs; otherwise the cache's own bytes (a CPU process's RSS is mostly itself)."""
    on_gpu = any("peak_device_mem_bytes" in r.metrics for r in results if r.status == OK)
    return "peak_device_mem_bytes" if on_gpu else "kv_cache_bytes"


def decide(results: list[CellResult], settings: Settings) -> list[Decision]:
    basis = memory_basis(results)
    groups: dict[GroupKey, list[CellResult]] = defaultdict(list)
    for result in results:
        groups[group_key(result)].append(result)
    names = display_names(key[0] for key in groups)
    decisions = [_decide_group(key, groups[key], basis, settings) for key in sorted(groups)]
    for decision in decisions:
        decision.model_name = names[decision.key[0]]
    return decisions


def _order(result: CellResult) -> tuple:
    base = result.cell["cache"].split("@", 1)[0]
    rank = CACHE_NAMES.index(base) if base in CACHE_NAMES else len(CACHE_NAMES)
    return (rank, result.cell["cache"], result.cell["compile"])


def _decide_group(key: GroupKey, results: list[CellResult], basis: str, settings: Settings) -> Decision:
    entries = [_entry(r, basis, settings) for r in sorted(results, key=_order)]
    dynamic = next((e for e in entries if e.label == "dynamic" and e.status == OK), None)
    for entry in entries:
        if entry.status == OK and dynamic is not None and entry is not dynamic:
            entry.deltas = _deltas(entry.result, dynamic.result, basis)
            slower = entry.deltas.get(settings.rank_by, 0.0) > 0
            entry.advice = entry.advice or slow_quantized_advice(entry.label, slower, True)
    decision = Decision(key, entries, basis, settings)
    eligible = [e for e in entries if e.eligible]
    if eligible:
        decision.fastest = min(eligible, key=lambda e: e.speed)
        limit = decision.fastest.speed * (1 + settings.max_slowdown)
        within = [e for e in eligible if e.speed <= limit and e.memory is not None]
        if within:
            decision.leanest = min(within, key=lambda e: (e.memory, e.speed))
    return decision


def _entry(result: CellResult, basis: str, settings: Settings) -> Entry:
    entry = Entry(strategy_label(result), result)
    m = result.metrics
    if result.status != OK:
        entry.advice = failure_advice(result.cell["cache"], bool(result.cell["compile"]), result.status, result.error)
        if result.tags.get("kvsweep.inferred") == "true":
            entry.flags.append("inferred from a smaller cell's OOM")
        return entry
    entry.speed = m.get(settings.rank_by)
    entry.memory = m.get(basis)
    shape_only = result.tags.get("kvsweep.shape_only") == "true"
    agreement = m.get("token_agreement")
    drifted = agreement is not None and agreement < settings.min_token_agreement
    if drifted:
        entry.flags.append(f"token agreement {agreement:.2f} < {settings.min_token_agreement:.2f}")
        entry.advice = quality_advice(agreement, settings.min_token_agreement)
    if "kvsweep.quality" in result.tags:
        entry.flags.append(f"quality {result.tags['kvsweep.quality']}")
    if shape_only:
        entry.flags.append("shape-only (random weights)")
    if result.tags.get("kvsweep.contended") == "true":
        entry.flags.append("GPU shared during measurement")
    implausible = result.tags.get("kvsweep.implausible") == "true"
    if implausible:
        utilization = m.get("decode_bandwidth_utilization", float("nan"))
        entry.flags.append(f"implausible: decode read {utilization:.2f}x the memory bandwidth")
    entry.eligible = entry.speed is not None and not (drifted and not shape_only) and not implausible
    return entry


def _deltas(result: CellResult, dynamic: CellResult, basis: str) -> dict[str, float]:
    out = {}
    for name, metric in (("tpot_ms", "tpot_ms"), ("ttft_ms", "ttft_ms"), ("memory", basis)):
        mine, theirs = result.metrics.get(metric), dynamic.metrics.get(metric)
        if mine is not None and theirs:
            out[name] = mine / theirs - 1
    return out
