"""The arithmetic of a forecast: FLOPs and bytes, divided by the rates a device sustains, term by term.

Each function is plain arithmetic on figures the planner has (parameters, shapes, the decode bytes of
`plan/kv_prediction.py`), so each can be checked by hand. A `Forecast` keeps its terms apart, with the arithmetic
behind each written out (`Term.detail`), so a user sees which term dominates and calibration can correct each.

Conventions: one multiply-add is 2 FLOP; rates are per second (FLOP/s, bytes/s); a host-link rate is one direction's,
as `planner.host_link_gbps` is.
"""

from dataclasses import dataclass

from kvsweep.forecast.sustained import STEP_OVERHEAD_S


def prefill_flops(
    params: int, tokens: int, layers: int, hidden: int, batch: int = 1, windows: tuple[int | None, ...] = ()
) -> float:
    """FLOPs of a prefill of `tokens` prompt tokens for each of `batch` rows.

    Matmuls: every weight multiplies every token once, a multiply-add each: 2 × params × tokens × batch. (`params`
    is what the caller counts: the model's parameter count overstates it by the embedding table, which is looked
    up, not multiplied; a head that computes only the last position's logits adds little.)

    Attention: per layer, QKᵀ and AV each take tokens × tokens × hidden multiply-adds over the full square,
    2 × 2 × layers × hidden × tokens²; a causal mask leaves half the square (tokens² / 2, ignoring the diagonal's
    tokens / 2), so 2 × layers × hidden × tokens² per row. `hidden` is the attention width, heads × head_dim (the
    model's hidden size for most decoders). `windows` (the shape's `layer_windows`, one per layer): a sliding
    window of w attends to at most w keys per query (`attended_pairs`), a layer that keeps no keys (a state or
    attention-free layer) to none; () means every layer attends to every earlier token.
    """
    matmuls = 2 * params * tokens
    pairs = sum(attended_pairs(tokens, w) for w in windows) if windows else layers * attended_pairs(tokens, None)
    attention = 2 * 2 * hidden * pairs  # QKᵀ and AV: a multiply-add each per width element per (query, key) pair
    return float((matmuls + attention) * batch)


def attended_pairs(tokens: int, window: int | None) -> float:
    """(query, key) pairs one causal layer computes over `tokens`: tokens² / 2 in full (the diagonal ignored, as
    above); with a window of w < tokens, the first w queries as in full and every later one w keys:
    w² / 2 + (tokens − w) × w; none for a layer that keeps no keys (window 0)."""
    if window is not None and window <= 0:
        return 0.0
    if window is None or tokens <= window:
        return tokens**2 / 2
    return window**2 / 2 + (tokens - window) * window


def prefill_seconds(flops: float, flop_rate: float) -> float:
    """A prefill is compute-bound (each weight is read once for many tokens): its FLOPs ÷ the sustained FLOP/s."""
    return flops / flop_rate


def decode_seconds(
    step_bytes: float,
    bandwidth: float,
    host_link_bytes: float = 0.0,
    host_link_bandwidth: float | None = None,
    overhead_s: float = STEP_OVERHEAD_S,
) -> float:
    """One decode step: the bytes it reads from device memory ÷ the sustained bandwidth, plus for an offloaded cache
    the bytes it moves over the host link ÷ the link's sustained rate, plus the step's host overhead.

    Decode is bandwidth-bound: each step reads every weight and the attended cache for one token per row. The
    link's bytes are added in series, as the planner's offload estimate adds them (`plan/offload.py`): the offloaded
    cache prefetches one layer while the previous one computes, and at long context the copies dwarf that compute,
    so little of them is hidden.
    """
    seconds = step_bytes / bandwidth + overhead_s
    if host_link_bytes:
        if not host_link_bandwidth:
            raise ValueError(f"{host_link_bytes:g} host-link bytes per step need a host-link bandwidth")
        seconds += host_link_bytes / host_link_bandwidth
    return seconds


def load_seconds(weight_bytes: float, rate: float) -> float:
    """Loading a model: its weight bytes ÷ the slowest rate they pass through (disk, host memory, the host link)."""
    return weight_bytes / rate


@dataclass(frozen=True)
class Term:
    """One part of a forecast: its seconds and the arithmetic behind them, written out for the user to check."""

    name: str
    seconds: float
    detail: str = ""  # "1.6e13 FLOP ÷ (9.9e14 FLOP/s × 0.6)"


@dataclass(frozen=True)
class Forecast:
    """A cell's forecast as the sum of its terms, kept apart so the largest can be named and each calibrated."""

    terms: tuple[Term, ...] = ()

    @property
    def total(self) -> float:
        return sum(term.seconds for term in self.terms)

    @property
    def largest(self) -> Term | None:
        """The term that dominates (the first of equals); None for an empty forecast."""
        return max(self.terms, key=lambda term: term.seconds, default=None)

    def describe(self) -> str:
        """One line per term, in order: its name, seconds, share of the total and arithmetic."""
        total = self.total
        width = max((len(term.name) for term in self.terms), default=0)
        lines = []
        for term in self.terms:
            share = term.seconds / total if total > 0 else 0.0
            line = f"{term.name:<{width}}  {duration(term.seconds):>9}  {share:>4.0%}"
            lines.append(f"{line}  {term.detail}" if term.detail else line)
        return "\n".join(lines)


# --- formatting -------------------------------------------------------------------------------------------------------


def sci(value: float) -> str:
    """Two significant figures in scientific notation, as a person writes it: 1.6e13, 2.0e-3."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 840 µs, 12.3 ms, 4.2 s, 3.5 min, 2.1 h."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
