"""How much traffic each cache and serving mode takes: the highest offered rate it sustains, and the next one tried.

A sweep with `workload.rate=[...]` replays its mix through every cache at each rate, with the same arrival times at
one rate. A cell sustains its rate when what it served (goodput: the requests meeting every SLO, per second, when an
SLO is set; else every request per second) stays within `TOLERANCE` of the rate offered. Both rates are over the
replay's span, which a server that keeps up still ends one request's time after the last arrival: that time (the
cell's median end-to-end latency) is allowed for, or a short mix would read as falling behind at any rate.

The saturation rate is the highest rate sustained from the lowest one up, stopping at the first that is not (a rate
above a failure that sustains again is noise, not capacity); the next rate tried, the one that failed, brackets it
(None: "not reached", the highest rate tried still sustained). Pure functions over results: `saturation.csv` and
the report's load-level section (`load_levels.py`) read them, and the selection's lines (`load_lines`).
"""

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from kvsweep.grid import NO_WEIGHT_QUANTIZATION, strategy_label
from kvsweep.model_names import display_names
from kvsweep.names import Metric
from kvsweep.results import OK, SKIPPED, CellResult

TOLERANCE = 0.05  # sustained: served at least (1 - this) of what a server keeping up would serve
GOODPUT, REQUESTS = "goodput", "requests/s"  # what a point's served rate is: with an SLO, or without one
MixKey = tuple[str, str, str, str]  # model, dtype, weights, workload
LoadKey = tuple[str, str, str, str, str, str, int]  # the mix's, then cache (+compile), serving mode, batch size
COLUMNS = (
    "model",
    "dtype",
    "weights",
    "workload",
    "cache",
    "serving",
    "batch_size",
    "saturation_rate",
    "next_rate",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "limit",
)
NOT_REACHED = "not reached"


@dataclass(frozen=True)
class RatePoint:
    """One cell of a load line: the rate it was offered and how much of it it served (None: no numbers)."""

    rate: float  # the cell's `rate` param, requests/s
    result: CellResult
    basis: str = ""  # GOODPUT or REQUESTS: which rate `served` is
    served: float | None = None  # requests/s, as measured over the replay's span
    share: float | None = None  # served over what a server keeping up would serve (1: all of it)

    @property
    def sustained(self) -> bool:
        return self.share is not None and self.share >= 1 - TOLERANCE

    @property
    def limit(self) -> str:
        """What failed here, for people: `goodput 0.61 of offered`, or the cell's status."""
        if self.result.status != OK:
            return self.result.status
        if self.share is None:
            return f"no {self.basis or 'rate'} measured"
        return f"{self.basis} {self.share:.2f} of offered"


@dataclass(frozen=True)
class Saturation:
    """One cache and serving mode over a mix's rates: the highest it sustains, and the next one tried."""

    key: LoadKey
    points: tuple[RatePoint, ...]  # by rate, ascending
    saturation_rate: float | None  # None: not even the lowest rate tried was sustained
    next_rate: float | None  # the first rate that failed; None: not reached
    limit: str  # what failed at `next_rate` ("" when not reached)

    @property
    def mix(self) -> MixKey:
        return self.key[:4]

    @property
    def cache(self) -> str:
        return self.key[4]

    @property
    def serving(self) -> str:
        return self.key[5]

    @property
    def batch_size(self) -> int:
        return self.key[6]

    @property
    def label(self) -> str:
        """`paged continuous B4`: the cache and how it served, as a line or a row names it."""
        return f"{self.cache} {self.serving} B{self.batch_size}"

    def describe(self) -> str:
        """`sustains 2 req/s (at 4: goodput 0.61 of offered)`, `sustains every rate tried, up to 4 req/s`."""
        if self.next_rate is None:
            return f"sustains every rate tried, up to {self.points[-1].rate:g} req/s"
        at = f"at {self.next_rate:g}: {self.limit}"
        if self.saturation_rate is None:
            return f"sustains no rate tried ({at})"
        return f"sustains {self.saturation_rate:g} req/s ({at})"


def load_key(result: CellResult) -> LoadKey:
    c = result.cell
    return (str(c.model), str(c.dtype), c.weights, c.workload, strategy_label(c), c.serving, int(c.batch_size))


def rate_point(result: CellResult) -> RatePoint:
    """The cell's served rate against what it was offered, allowing for the last request's own time."""
    rate, m = float(result.cell.rate), result.metrics
    if result.status != OK:
        return RatePoint(rate, result)
    basis = GOODPUT if Metric.GOODPUT_REQUESTS_PER_S in m else REQUESTS
    served = m.get(Metric.GOODPUT_REQUESTS_PER_S if basis == GOODPUT else Metric.REQUESTS_PER_S)
    offered = m.get(Metric.OFFERED_REQUESTS_PER_S) or rate
    if served is None or offered <= 0:
        return RatePoint(rate, result, basis, served)
    return RatePoint(rate, result, basis, served, served / keeping_up(offered, m))


def keeping_up(offered: float, metrics: dict[str, float]) -> float:
    """What a server that keeps up serves over the replay's span: n requests over the arrivals' span,
    (n - 1) / offered, and the median request's own time after the last arrival. The offered rate itself when
    the cell lacks the count or the latency to say so."""
    n, e2e_ms = metrics.get(Metric.REPEATS), metrics.get(Metric.E2E_MS_P50)
    if not n or n < 2 or e2e_ms is None:
        return offered
    return n / ((n - 1) / offered + e2e_ms / 1e3)


def saturation(results: Iterable[CellResult]) -> list[Saturation]:
    """One per cache (+compile), serving mode and B of each mix, over its open-loop cells (rate above 0; a closed
    loop and a skipped cell left out); sorted by mix, then cache, serving mode and B."""
    lines: dict[LoadKey, dict[float, CellResult]] = defaultdict(dict)
    for result in results:
        if result.cell.is_workload and result.cell.rate > 0 and result.status != SKIPPED:
            lines[load_key(result)][float(result.cell.rate)] = result
    return [saturation_of(key, [rate_point(r) for _, r in sorted(lines[key].items())]) for key in sorted(lines)]


def saturation_of(key: LoadKey, points: list[RatePoint]) -> Saturation:
    """The rule over one line's points, ascending by rate: sustained up to the first failure."""
    held: float | None = None
    for point in points:
        if not point.sustained:
            return Saturation(key, tuple(points), held, point.rate, point.limit)
        held = point.rate
    return Saturation(key, tuple(points), held, None, "")


def best_sustained(saturations: Iterable[Saturation]) -> dict[MixKey, Saturation]:
    """Per mix: the cache and serving mode that sustains the highest rate (ties: one that reached no failing
    rate, then the larger share served at its failing rate); mixes where none sustained any rate left out. What
    the selection's load line names."""
    best: dict[MixKey, Saturation] = {}
    for s in saturations:
        if s.saturation_rate is not None and (s.mix not in best or _standing(s) > _standing(best[s.mix])):
            best[s.mix] = s
    return best


def _standing(s: Saturation) -> tuple[float, bool, float]:
    failed = next((p for p in s.points if p.rate == s.next_rate), None)
    share = failed.share if failed is not None and failed.share is not None else 0.0
    return (s.saturation_rate or 0.0, s.next_rate is None, share)


def sustain_line(s: Saturation, mix_name: str) -> str:
    """`chat on SmolLM2 float32: paged continuous B4 sustains 2 req/s (at 4: goodput 0.61 of offered)`."""
    return f"{mix_name}: {s.label} {s.describe()}"


def load_lines(results: Iterable[CellResult]) -> list[str]:
    """The selection's load lines, one per mix offered rates: the cache and serving mode that sustains the highest
    rate within the SLOs (`best_sustained`), or that none sustained the lowest rate tried. Empty without rates."""
    found = saturation(results)
    best = best_sustained(found)
    mixes = list(dict.fromkeys(s.mix for s in found))
    names = display_names(mix[0] for mix in mixes)
    lines = []
    for mix in mixes:
        title = mix_title(mix, names[mix[0]])
        if mix in best:
            lines.append(sustain_line(best[mix], title))
        else:
            lowest = min(p.rate for s in found if s.mix == mix for p in s.points)
            lines.append(f"{title}: no cache and serving mode sustains the lowest rate tried ({lowest:g} req/s)")
    return lines


def mix_title(mix: MixKey, model_name: str) -> str:
    """`chat on SmolLM2-135M float32` (its weights' quantization after the model, when it has one)."""
    _, dtype, weights, workload = mix
    quantized = "" if weights == NO_WEIGHT_QUANTIZATION else f" {weights}"
    return f"{workload} on {model_name}{quantized} {dtype}"


def saturation_csv(saturations: Iterable[Saturation], slo_ttft_ms: float = 0.0, slo_tpot_ms: float = 0.0) -> str:
    """`saturation.csv`: a row per cache, serving mode and B of each mix (`COLUMNS`); empty where a row has no
    value (no rate sustained; a next rate not reached, said in `limit`), an SLO of 0 empty too."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for s in saturations:
        model, dtype, weights, workload, cache, serving, batch = s.key
        writer.writerow(
            [
                model,
                dtype,
                weights,
                workload,
                cache,
                serving,
                batch,
                _blank(s.saturation_rate),
                _blank(s.next_rate),
                _blank(slo_ttft_ms or None),
                _blank(slo_tpot_ms or None),
                s.limit if s.next_rate is not None else NOT_REACHED,
            ]
        )
    return out.getvalue()


def _blank(value: float | None) -> str:
    return "" if value is None else f"{value:g}"
