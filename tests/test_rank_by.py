"""Every `report.rank_by` judges a quantized cache by the timing it ranks by: slower than dynamic on that
timing earns the "not the default" advice, whatever the other timings say. From recorded results."""

import pytest

from kvsweep.grid import Cell
from kvsweep.names import Metric
from kvsweep.report.selection import Settings, cost_text, decide
from kvsweep.results import OK, CellResult

TIMINGS = (Metric.TPOT_MS, Metric.TTFT_MS, Metric.E2E_MS)
DYNAMIC = {Metric.TPOT_MS: 10.0, Metric.TTFT_MS: 100.0, Metric.E2E_MS: 400.0}
ADVICE = "do not make a quantized cache the default"


def recorded(cache: str, timings: dict[str, float], kv_bytes: float) -> CellResult:
    cell = Cell("org/trained", "bfloat16", 1024, 1, 32, cache, False)
    metrics = {**timings, Metric.KV_CACHE_BYTES: kv_bytes, Metric.TOKEN_AGREEMENT: 1.0}
    return CellResult(f"{cache}-1024", cell, OK, metrics=metrics)


def quantized(slower_on: str, factor: float) -> CellResult:
    """Against dynamic: `factor` times its value on one timing, 0.8 times on the other two."""
    timings = {m: v * (factor if m == slower_on else 0.8) for m, v in DYNAMIC.items()}
    return recorded("quantized-hqq-int4", timings, kv_bytes=300.0)


@pytest.mark.parametrize("rank_by", TIMINGS)
def test_slower_on_the_ranking_timing_is_advised_against(rank_by):
    results = [recorded("dynamic", DYNAMIC, 1000.0), quantized(slower_on=rank_by, factor=1.2)]
    [decision] = decide(results, Settings(rank_by=rank_by))
    entry = next(e for e in decision.entries if e.label == "quantized-hqq-int4")
    assert entry.deltas[rank_by.removesuffix("_ms").upper()] == pytest.approx(0.2)  # 1.2x dynamic
    assert ADVICE in entry.advice
    assert decision.pick.label == "dynamic"  # the lower rank_by
    label = {Metric.TPOT_MS: "TPOT", Metric.TTFT_MS: "TTFT", Metric.E2E_MS: "E2E"}[rank_by]
    assert f"{label} +20%" in cost_text(entry)  # its cost names the timing it was ranked by


@pytest.mark.parametrize("rank_by", TIMINGS)
def test_faster_on_the_ranking_timing_gets_no_such_advice(rank_by):
    timings = {m: DYNAMIC[m] * (0.8 if m == rank_by else 1.5) for m in TIMINGS}  # slower on both others
    results = [recorded("dynamic", DYNAMIC, 1000.0), recorded("quantized-hqq-int4", timings, 300.0)]
    [decision] = decide(results, Settings(rank_by=rank_by))
    entry = next(e for e in decision.entries if e.label == "quantized-hqq-int4")
    assert entry.deltas[rank_by.removesuffix("_ms").upper()] == pytest.approx(-0.2)
    assert entry.deltas["TPOT" if rank_by != Metric.TPOT_MS else "TTFT"] == pytest.approx(0.5)
    assert entry.advice == ""
    # 50% slower than dynamic on the two other latencies: never the pick, and the line says why...
    assert decision.pick.label == "dynamic"
    others = [m for m in TIMINGS if m != rank_by]
    for other in others:
        name = {Metric.TPOT_MS: "TPOT", Metric.TTFT_MS: "TTFT", Metric.E2E_MS: "E2E"}[other]
        assert f"{name} +50% > 10%" in decision.summary()
    # ...unless the user waives them: then the faster ranked timing wins
    [waived] = decide(results, Settings(rank_by=rank_by, waive_slowdown=tuple(others)))
    assert waived.pick.label == "quantized-hqq-int4"
