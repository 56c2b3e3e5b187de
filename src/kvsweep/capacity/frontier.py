"""Whether one probe passes: it ran (no OOM) and meets the SLO, judged on its 95% intervals' upper ends.

A median under the SLO with an interval reaching over it has not shown it meets the SLO: a serving team sizes for
what it can promise, so the search judges the upper end, never the median.

Frontiers are rebuilt from the probes' results alone (the live sweep and `kvsweep report` alike), whatever order
the search asked for them in: the largest passing value below the smallest failing one, the probe above saying why.
"""

from dataclasses import dataclass

from kvsweep.grid import NO_WEIGHT_QUANTIZATION, Cell, strategy_label
from kvsweep.names import Metric, ResultTag, ci_high
from kvsweep.results import OK, OOM, SKIPPED, CellResult

MEMORY, SLO_TPOT, SLO_TTFT = "memory", "slo_tpot", "slo_ttft"
MAX_BATCH, MAX_CONTEXT = "search.max_batch", "search.max_context"
SKIP, FAILED, UNFINISHED = "skipped", "error", "unfinished"  # the frontier could not be found


@dataclass(frozen=True)
class Slo:
    """What a probe must meet; 0 leaves a bound unset."""

    tpot_ms: float = 0.0
    ttft_ms: float = 0.0

    def describe(self) -> str:
        parts = [
            f"tpot <= {self.tpot_ms:g} ms" if self.tpot_ms else "",
            f"ttft <= {self.ttft_ms:g} ms" if self.ttft_ms else "",
        ]
        return " and ".join(p for p in parts if p)


@dataclass(frozen=True)
class Verdict:
    passes: bool
    limit: str = ""  # why not: memory | slo_tpot | slo_ttft | skipped | error
    detail: str = ""  # the numbers or the message behind it, for the report's line

    @property
    def decisive(self) -> bool:
        """A probe that passed or failed for a reason that grows with size (memory, the SLO): the search goes on.
        Anything else (an error, a timeout, a skip) stops its frontier where it stands."""
        return self.passes or self.limit in (MEMORY, SLO_TPOT, SLO_TTFT)


def upper_end(result: CellResult, metric: str) -> float | None:
    """The upper end of the metric's 95% interval; the median where no interval was recorded."""
    return result.metrics.get(ci_high(metric), result.metrics.get(metric))


def probe_verdict(result: CellResult, slo: Slo) -> Verdict:
    if result.status == OOM:
        return Verdict(False, MEMORY, result.error)
    if result.status == SKIPPED:
        return Verdict(False, SKIP, result.error)
    if result.status != OK:
        return Verdict(False, FAILED, f"{result.status}: {result.error}")
    for bound, metric, limit in ((slo.tpot_ms, Metric.TPOT_MS, SLO_TPOT), (slo.ttft_ms, Metric.TTFT_MS, SLO_TTFT)):
        high = upper_end(result, metric)
        if bound and (high is None or high > bound):
            seen = "not measured" if high is None else f"{high:.3g} ms at the 95% upper end"
            return Verdict(False, limit, f"{metric} {seen} > {bound:g} ms")
    return Verdict(True)


BATCH, CONTEXT = "batch", "context"  # the axis a frontier searches (`kvsweep.search`)


@dataclass(frozen=True)
class SearchSettings:
    """What a search was asked: its ceilings, the context search's resolution and the SLO."""

    slo: Slo
    max_batch: int
    context_step: int
    max_context: int  # 0: each model's positions less the new tokens (the driver knows it; a probe says it)


@dataclass(frozen=True)
class FrontierKey:
    """One search: a cell family at a fixed size on the other axis (a context for a batch search)."""

    axis: str
    model: str
    dtype: str
    cache: str
    compile: bool
    max_new_tokens: int
    inputs: str
    fixed: int  # context_length of a batch search, batch_size of a context search
    weights: str = NO_WEIGHT_QUANTIZATION

    @classmethod
    def of(cls, cell: Cell, axis: str) -> "FrontierKey":
        fixed = cell.context_length if axis == BATCH else cell.batch_size
        c = cell
        return cls(axis, c.model, c.dtype, c.cache, c.compile, c.max_new_tokens, c.inputs, fixed, c.weights)

    def cell(self, value: int) -> Cell:
        """The probe at `value`: a batch size, or a context length in tokens."""
        context, batch = (self.fixed, value) if self.axis == BATCH else (value, self.fixed)
        return Cell(
            self.model,
            self.dtype,
            context,
            batch,
            self.max_new_tokens,
            self.cache,
            self.compile,
            self.inputs,
            self.weights,
        )

    def value(self, cell: Cell) -> int:
        return cell.batch_size if self.axis == BATCH else cell.context_length

    @property
    def strategy(self) -> str:
        return strategy_label(self.cell(1))


@dataclass(frozen=True)
class Frontier:
    key: FrontierKey
    value: int  # max_batch or max_context; 0 when not even the smallest probe passed
    limit: str  # memory | slo_tpot | slo_ttft | search.max_batch | search.max_context | skipped | error | unfinished
    detail: str  # the numbers behind the limit
    at: CellResult | None  # the probe at the frontier (None when nothing passed)
    predicted: int | None  # the planner's boundary for the same limit (memory); None: unknown
    probes: int  # probes that ran (inferred OOMs and skips not counted)
    limited_by: CellResult | None = None  # the probe just past the frontier
    results: tuple[CellResult, ...] = ()  # every probe of this frontier's family and fixed size

    @property
    def goodput_tokens_per_s(self) -> float | None:
        """Decode tokens per second of the whole batch at the frontier, where it meets the SLO."""
        return None if self.at is None else self.at.metrics.get(Metric.DECODE_TOKENS_PER_S)


def unit(key: FrontierKey, settings: SearchSettings) -> int:
    return 1 if key.axis == BATCH else settings.context_step


def ceiling(key: FrontierKey, settings: SearchSettings, positions: int | None) -> int:
    """The search's top value, in the axis's own units: `search.max_batch`, or the longest context
    `search.max_context` and the model's positions allow (in tokens, a multiple of the step)."""
    if key.axis == BATCH:
        return settings.max_batch
    longest = settings.max_context or ((positions - key.max_new_tokens) if positions else 0)
    if positions:
        longest = min(longest, positions - key.max_new_tokens)
    return max(longest // settings.context_step, 1) * settings.context_step


def _recorded(probes: list[CellResult], metric: str) -> int | None:
    """A figure the driver stamped on the search's probes (the first probe that has it)."""
    return next((int(r.metrics[metric]) for r in probes if metric in r.metrics), None)


def frontier_of(key: FrontierKey, settings: SearchSettings, probes: list[CellResult]) -> Frontier:
    """The frontier its probes show, whatever order they were asked in: the largest passing value below
    the smallest failing one. It is found when the failure is the very next value (or the pass is the
    ceiling); a probe in between that neither passed nor failed for size (an error, a skip) stopped it."""
    step = unit(key, settings)
    probes = [r for r in probes if key.value(r.cell) % step == 0]  # a grid cell between the search's steps is not one
    by_value = {key.value(r.cell) // step: r for r in probes}
    verdicts = {value: probe_verdict(result, settings.slo) for value, result in sorted(by_value.items())}
    batch = key.axis == BATCH
    predicted = _recorded(probes, Metric.PREDICTED_MAX_BATCH if batch else Metric.PREDICTED_MAX_CONTEXT)
    top = (settings.max_batch if batch else (_recorded(probes, Metric.SEARCH_MAX_CONTEXT) or step)) // step
    above = min((v for v, verdict in verdicts.items() if verdict.decisive and not verdict.passes), default=top + 1)
    best = max((v for v, verdict in verdicts.items() if verdict.passes and v < above), default=0)
    stopped = [v for v, verdict in verdicts.items() if best < v < above and not verdict.decisive]
    ran = sum(r.tags.get(ResultTag.INFERRED) != "true" and r.status != SKIPPED for r in probes)
    past: CellResult | None = None
    if best == top:
        limit, detail = (MAX_BATCH if batch else MAX_CONTEXT), f"{best * step} reached"
    elif stopped:
        verdict = verdicts[stopped[0]]
        limit, detail, past = verdict.limit or FAILED, f"at {stopped[0] * step}: {verdict.detail}", by_value[stopped[0]]
    elif above == best + 1:
        limit, detail, past = verdicts[above].limit, verdicts[above].detail, by_value[above]
    else:
        limit, detail = UNFINISHED, "the search was interrupted before its frontier was bracketed"
    at = by_value.get(best) if best else None
    return Frontier(key, best * step, limit, detail[:300], at, predicted, ran, past, tuple(probes))


def frontiers(results: list[CellResult], settings: SearchSettings) -> list[Frontier]:
    """Every frontier the results hold probes of. `kvsweep.search` names the searches that asked for a
    probe first; a probe one search measured and another then read (where a batch and a context search
    meet) counts for both, so every result of a searched family and fixed size is taken, whatever its tag."""
    keys: dict[FrontierKey, list[CellResult]] = {}
    for result in results:
        for axis in result.tags.get(ResultTag.SEARCH, "").split("+"):
            if axis in (BATCH, CONTEXT):
                keys.setdefault(FrontierKey.of(result.cell, axis), [])
    for result in results:
        for axis in (BATCH, CONTEXT):
            if (key := FrontierKey.of(result.cell, axis)) in keys:
                keys[key].append(result)
    return [frontier_of(key, settings, probes) for key, probes in keys.items()]
