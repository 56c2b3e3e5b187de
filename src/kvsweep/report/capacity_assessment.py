"""Capacity in the report: every search's frontier, whether quality lets it be recommended, and a pick per size.

Frontiers come from the results alone (`capacity/frontier.py`). At each size a search held fixed, the pick goes
furthest (max batch or max context), ties broken by goodput, and never fails the quality gate (`quality_gate.py`,
the selection's verdicts), judged against dynamic's frontier probe at the same context (task accuracy does not
depend on batch), else any dynamic cell that ran at that context.
"""

from dataclasses import dataclass, field

from kvsweep.caches import BASELINE, cache_rank
from kvsweep.capacity.frontier import (
    BATCH,
    MAX_BATCH,
    MAX_CONTEXT,
    MEMORY,
    SLO_TPOT,
    SLO_TTFT,
    Frontier,
    SearchSettings,
    frontiers,
)
from kvsweep.config.schema import RayConfig, ReportConfig
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, strategy_label
from kvsweep.model_names import display_names
from kvsweep.names import ResultTag
from kvsweep.report.quality_gate import Gate, judge
from kvsweep.report.selection import Settings
from kvsweep.results import OK, CellResult

FRONTIER_KINDS = {BATCH: "max_batch"}  # `kvsweep.frontier` per axis; any other axis is the context search's
CONTEXT_KIND = "max_context"
SizeKey = tuple[str, str, str, int, int, str]  # axis, model, dtype, new tokens, the fixed size, weights
# What a reader needs to know about how a frontier ended, short enough for a table cell and a figure's legend.
LIMIT_MARKS = {MEMORY: "mem", SLO_TPOT: "slo tpot", SLO_TTFT: "slo ttft", MAX_BATCH: "cap", MAX_CONTEXT: "cap"}


@dataclass(frozen=True)
class CapacityContext:
    """What the report needs to rebuild capacity: the search's settings and what a GPU-hour costs.
    Each default is the schema's for the key it stands for."""

    search: SearchSettings
    gpu_hour_cost: float = ReportConfig().gpu_hour_cost  # price of one GPU-hour (report.gpu_hour_cost); 0: no cost
    gpus_per_cell: int = RayConfig().gpus_per_cell  # GPUs a probe held (ray.gpus_per_cell): they are all paid for

    def cost_per_1m_tokens(self, goodput_tokens_per_s: float | None) -> float | None:
        """A million output tokens at this goodput: the cell's GPUs for as many seconds as they take."""
        if self.gpu_hour_cost <= 0 or not goodput_tokens_per_s:
            return None
        return self.gpu_hour_cost * self.gpus_per_cell / 3600 / goodput_tokens_per_s * 1e6


def limit_mark(limit: str) -> str:
    """`mem`, `slo tpot`, `cap`; other limits (skipped, error, unfinished) as they are."""
    return LIMIT_MARKS.get(limit, limit)


@dataclass
class Standing:
    """One strategy's frontier at one size, and what quality says about the probe at it."""

    frontier: Frontier
    gate: Gate = field(default_factory=Gate)
    judged_against: CellResult | None = None  # dynamic's cell the gate compared it with

    @property
    def label(self) -> str:
        return self.frontier.key.strategy

    @property
    def refused(self) -> bool:
        return self.gate.refused

    @property
    def eligible(self) -> bool:
        """Went anywhere (something passed) and quality does not keep it from being recommended."""
        return self.frontier.value > 0 and not self.refused

    def rank(self) -> tuple[int, float]:
        return self.frontier.value, self.frontier.goodput_tokens_per_s or 0.0


@dataclass
class SizeChoice:
    """Every strategy's frontier at one fixed size of one model/dtype/new tokens, and the one that goes furthest."""

    key: SizeKey
    standings: list[Standing]  # registry order, simplest first
    context: CapacityContext
    model_name: str = ""
    pick: Standing | None = None
    dynamic: Standing | None = None

    @property
    def axis(self) -> str:
        return self.key[0]

    def size_text(self, value: int) -> str:
        """`batch 24` for a batch search, `ctx 65536` for a context search."""
        return f"batch {value}" if self.axis == BATCH else f"ctx {value}"

    def line(self) -> str:
        """`most capacity at ctx 32768 within tpot <= 50 ms: quantized-hqq-int4 (batch 24, 410 tok/s; dynamic: ...)`."""
        _, model, dtype, new, fixed, _ = self.key
        slo = self.context.search.slo.describe()
        what = f"most capacity at ctx {fixed}" if self.axis == BATCH else f"longest context at batch {fixed}"
        head = (
            f"{self.model_name or model} {dtype} new{new}: {what} {f'within {slo}' if slo else '(no SLO: memory only)'}"
        )
        if self.pick is None:
            failed = [f"{s.label} {s.frontier.limit}" for s in self.standings if s.frontier.value == 0]
            text = f"{head}: no strategy to recommend" + (f" (none passed: {', '.join(failed)})" if failed else "")
        else:
            text = f"{head}: {self.pick.label} ({self._numbers(self.pick)}"
            text += ")" if self.pick is self.dynamic else f"; {self._dynamic_text()})"
        refused = [s for s in self.standings if s.refused and s.frontier.value > 0]
        if refused:
            reasons = [f"{s.label} ({self.size_text(s.frontier.value)}; {'; '.join(s.gate.refusals)})" for s in refused]
            text += f"; refused for quality: {', '.join(reasons)}"
        return text

    def _numbers(self, standing: Standing) -> str:
        """`batch 24, 410 tok/s, 1.36 per 1M tokens`; a frontier not bounded by memory or the SLO says how it ended."""
        frontier = standing.frontier
        size = self.size_text(frontier.value)
        if frontier.limit not in (MEMORY, SLO_TPOT, SLO_TTFT):
            size += f" ({frontier.limit})"
        goodput = frontier.goodput_tokens_per_s
        parts = [size, "goodput unknown" if goodput is None else f"{goodput:.0f} tok/s"]
        cost = self.context.cost_per_1m_tokens(goodput)
        if cost is not None:
            parts.append(f"{cost:.3g} per 1M tokens")
        return ", ".join(parts)

    def _dynamic_text(self) -> str:
        where = f"ctx {self.key[4]}" if self.axis == BATCH else f"batch {self.key[4]}"
        if self.dynamic is None:
            return f"dynamic: no frontier at {where} (not searched)"
        if self.dynamic.frontier.value == 0:
            return f"dynamic: none passed at {where} ({self.dynamic.frontier.limit})"
        return f"dynamic: {self._numbers(self.dynamic)}"


@dataclass
class Capacity:
    """The report's capacity section: every frontier, judged, and a choice per size."""

    context: CapacityContext
    frontiers: list[Frontier]
    choices: list[SizeChoice]

    def lines(self) -> list[str]:
        return [choice.line() for choice in self.choices]

    def heading(self) -> str:
        slo = self.context.search.slo.describe()
        met = f" and met {slo} (on the 95% upper end)" if slo else " (no SLO)"
        return (
            f"Capacity (largest batch per context, longest context per batch, that fit{met}; the pick goes "
            "furthest, ties broken by goodput; caches refused for quality are never recommended):"
        )

    def tags(self) -> dict[str, dict[str, str]]:
        return frontier_tags(self.frontiers)


def frontier_tags(found: list[Frontier]) -> dict[str, dict[str, str]]:
    """Cell id of each frontier's probe -> `kvsweep.frontier` (max_batch, max_context, max_batch+max_context
    for a probe at both) and `kvsweep.frontier_limit` (its limit; both, `+`-joined batch first, when they differ)."""
    kinds: dict[str, dict[str, str]] = {}
    for frontier in sorted(found, key=lambda f: f.key.axis != BATCH):
        if frontier.at is not None:
            kinds.setdefault(frontier.at.cell_id, {})[FRONTIER_KINDS.get(frontier.key.axis, CONTEXT_KIND)] = (
                frontier.limit
            )
    return {
        cid: {ResultTag.FRONTIER: "+".join(limits), ResultTag.FRONTIER_LIMIT: "+".join(dict.fromkeys(limits.values()))}
        for cid, limits in kinds.items()
    }


def size_key(frontier: Frontier) -> SizeKey:
    key = frontier.key
    return key.axis, key.model, key.dtype, key.max_new_tokens, key.fixed, key.weights


def assess(results: list[CellResult], context: CapacityContext, settings: Settings) -> Capacity:
    """Every frontier the results hold, judged for quality, and the pick at each size."""
    found = frontiers(results, context.search)
    by_size: dict[SizeKey, list[Frontier]] = {}
    for frontier in found:
        by_size.setdefault(size_key(frontier), []).append(frontier)
    names = display_names(key[1] for key in by_size)
    dynamic_cells = _dynamic_cells(results)
    choices = []
    for key in sorted(by_size, key=lambda k: (k[0] != BATCH, *k[1:])):
        ordered = sorted(by_size[key], key=lambda f: (*cache_rank(f.key.cache), f.key.compile))
        dynamic = next((f for f in ordered if f.key.strategy == BASELINE), None)
        standings = [_standing(f, dynamic, dynamic_cells, settings) for f in ordered]
        weights = "" if key[5] == NO_WEIGHT_QUANTIZATION else f" {key[5]}"  # each weights setting its own
        choice = SizeChoice(key, standings, context, names[key[1]] + weights)
        choice.dynamic = next((s for s in standings if s.frontier is dynamic), None)
        eligible = [s for s in standings if s.eligible]
        choice.pick = max(eligible, key=Standing.rank) if eligible else None  # the first (simplest) of equals
        choices.append(choice)
    return Capacity(context, found, choices)


CellKey = tuple[str, str, int, int, str, str]  # model, dtype, context, new tokens, inputs, weights: a task answer's


def _cell_key(result: CellResult) -> CellKey:
    c = result.cell
    return c.model, c.dtype, c.context_length, c.max_new_tokens, c.inputs, c.weights


def _dynamic_cells(results: list[CellResult]) -> dict[CellKey, CellResult]:
    """Dynamic's cells that ran, one per context (the smallest batch), for strategies whose dynamic found none."""
    cells: dict[CellKey, CellResult] = {}
    for result in sorted(results, key=lambda r: r.cell.batch_size, reverse=True):
        if result.status == OK and strategy_label(result.cell) == BASELINE:
            cells[_cell_key(result)] = result
    return cells


def _standing(
    frontier: Frontier, dynamic: Frontier | None, dynamic_cells: dict[CellKey, CellResult], settings: Settings
) -> Standing:
    if frontier.at is None:
        return Standing(frontier)
    key = _cell_key(frontier.at)
    reference = dynamic.at if dynamic is not None and dynamic.at is not None else None
    if reference is None or _cell_key(reference) != key:
        reference = dynamic_cells.get(key)
    gate = judge(
        frontier.at,
        reference,
        max_accuracy_drop=settings.max_accuracy_drop,
        max_kl=settings.max_kl,
        min_token_agreement=settings.min_token_agreement,
    )
    return Standing(frontier, gate, reference)
