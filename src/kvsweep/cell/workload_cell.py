"""Measure a workload cell: replay the sweep's mix through the cell's cache and serving mode, then its numbers.

The mix is the sweep's, fitted to this model's positions as the planner fitted it. Its first requests are replayed
once, uncounted, as the warmup; a compiled cell first replays the whole mix cold (every new prompt shape compiles:
`recompiles`; `compile_s`, the cold replay's server seconds beyond the measured one's, see `workload_replay`), then
the measured replay. A static layout is sized for the mix's worst moment (its longest request; in batched serving
its worst batch), as a server must size it, and every request runs in it (`static_unused_share` says what that
reserves unused). Batched through `generate`, every row runs to its batch's longest output (`overgeneration_share`:
the tokens generated past the rows' own outputs).
"""

from dataclasses import asdict
from typing import Any

import torch

from kvsweep.caches import CacheStrategy
from kvsweep.cell.checks import check_cache, check_no_recapture
from kvsweep.cell.generate_session import GenerateSession, MeasuredCall
from kvsweep.cell.paged_session import PagedSession
from kvsweep.cell.workload_replay import (
    Replay,
    RequestTimes,
    compile_seconds,
    prompt_ids,
    replay_generate,
    replay_paged,
)
from kvsweep.grid import Cell
from kvsweep.inputs.prompt import Prompt
from kvsweep.measure.cache_identity import KvBytes
from kvsweep.measure.phase_meters import compile_events
from kvsweep.measure.sampling import TokenTimes
from kvsweep.measure.statistics import interval_metrics
from kvsweep.names import WORKLOAD_PERCENTILES, Metric, ResultTag, ci_high, ci_low
from kvsweep.plan.workload_cells import served_strategy
from kvsweep.workload.latency_stats import (
    RequestTiming,
    goodput,
    overgeneration_share,
    padding_share,
    percentile_with_interval,
    static_unused_share,
)
from kvsweep.workload.workload_spec import BATCHED, WorkloadSpec, fitted

PERCENTILES = (50, 90, 99)


def measure_workload(
    session: GenerateSession,
    strategy: CacheStrategy,
    spec: WorkloadSpec,
    positions: int | None,
    vocab: int,
    seed: int,
    text: list[Prompt] | None = None,
) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """(metrics, samples, tags) of the cell's replay of `spec`'s mix; `text`: a prompts file's requests as encoded
    here (`workload_text.py`), else every prompt is random ids."""
    cell = session.cell
    mix = fitted(spec.mix_for(cell.model, cell.rate), positions)  # at the cell's rate's arrival times, if any
    prompts = [list(p.ids) for p in text] if text else prompt_ids(mix.requests, vocab, seed)
    served = served_strategy(strategy, cell)
    warm = mix.requests[: spec.warmup_requests]
    offered = cell.rate or mix.offered_rate  # open loop: the arrival rate offered (the cell's, or a trace's own)
    metrics: dict[str, float] = {Metric.OFFERED_REQUESTS_PER_S: offered} if offered else {}
    if cell.compile:
        before = compile_events()
        cold = _replay(session, served, mix.requests, prompts, cell)
        metrics[Metric.RECOMPILES] = float(compile_events() - before)
    elif warm:
        _replay(session, served, warm, prompts, cell)
    compiled_before = compile_events() if cell.compile else 0
    replay = _replay(session, served, mix.requests, prompts, cell)
    if cell.compile:
        metrics[Metric.COMPILE_S] = compile_seconds(cold, replay)  # server seconds: arrival gaps cannot hide them
        metrics[Metric.COMPILE_RECAPTURES] = float(compile_events() - compiled_before)
        del cold
        check_no_recapture(int(metrics[Metric.COMPILE_RECAPTURES]))  # after recording: the numbers stay, the cell fails
    metrics |= request_metrics(replay.requests, replay.span_s, spec)
    metrics |= memory_metrics(replay.calls)
    if served.preallocates and served.family != "paged":
        reserved = served.static_length(cell.cached_tokens)
        metrics[Metric.STATIC_UNUSED_SHARE] = static_unused_share(mix, reserved, cell.batch_size)
    if cell.serving == BATCHED and served.family != "paged":  # continuous batching pads nothing, stops each at its own
        metrics[Metric.PADDING_SHARE] = padding_share(mix, cell.batch_size)
        metrics[Metric.OVERGENERATION_SHARE] = overgeneration_share(mix, cell.batch_size)
    samples = {"requests": [asdict(r) for r in replay.requests], "mix_sha256": mix.sha256}
    tags = {}
    if replay.calls and (paged := replay.calls[-1].paged) is not None:
        tags[ResultTag.PAGED_POOL] = f"{paged.pool.describe()} usable_blocks={paged.usable_blocks} " + (
            f"attention={paged.attention}"
        )
    return metrics, samples, tags


def _replay(
    session: GenerateSession, strategy: CacheStrategy, requests: Any, prompts: list[list[int]], cell: Cell
) -> Replay:
    """One replay of `requests`, by the path that serves this strategy."""
    if isinstance(session, PagedSession) and strategy.family == "paged":
        return _replay_paged(session, strategy, requests, prompts, cell)
    return replay_generate(
        session, strategy, requests, prompts, cell.serving, cell.batch_size, lambda c: check_cache(strategy, c, cell)
    )


def _replay_paged(
    session: PagedSession, strategy: CacheStrategy, requests: Any, prompts: list[list[int]], cell: Cell
) -> Replay:
    """Continuous batching: the replay's memory and pool are read around the whole of it, as one call."""
    session.started(strategy)
    session.calls += 1
    session.reset_peak()
    session.peak_memory.start()
    try:
        timed, span = replay_paged(
            lambda items: session.add_requests(strategy, items),
            session.next_result,
            requests,
            prompts,
            cell.serving,
            cell.batch_size,
            tag=f"replay{session.calls}",
        )
    except BaseException:
        session.peak_memory.abandon()
        raise
    peak = session.peak_memory.stop()
    kv, reading, identity = session.pool_reading(strategy)
    times = TokenTimes(timed[0].ttft_ms, [], timed[-1].e2e_ms)  # the replay as one call: only its memory is read
    call = MeasuredCall(times, peak, torch.empty(0, dtype=torch.long), kv, identity, paged=reading)
    check_cache(strategy, call, cell)
    return Replay(timed, span, [call])


def request_metrics(requests: list[RequestTimes], span_s: float, spec: WorkloadSpec) -> dict[str, float]:
    """Per-request percentiles with their exact intervals, medians under the plain names, rates and goodput."""
    series = {
        WORKLOAD_PERCENTILES[0]: [r.ttft_ms for r in requests],
        WORKLOAD_PERCENTILES[1]: [r.tpot_ms for r in requests if r.tpot_ms is not None],
        WORKLOAD_PERCENTILES[2]: [r.e2e_ms for r in requests],
    }
    metrics: dict[str, float] = {}
    for names, values in series.items():
        if not values:
            continue
        for name, q in zip(names, PERCENTILES, strict=True):
            estimate = percentile_with_interval(values, q)
            metrics[name] = estimate.value
            if estimate.ci_low is not None and estimate.ci_high is not None:
                metrics[ci_low(name)], metrics[ci_high(name)] = estimate.ci_low, estimate.ci_high
    for plain, (names, values) in zip((Metric.TTFT_MS, Metric.TPOT_MS, Metric.E2E_MS), series.items(), strict=True):
        if values:  # the median under its plain name, with the interval plain cells carry
            metrics[plain] = metrics[names[0]]
            metrics |= {k: v for k, v in interval_metrics(plain, values).items() if k != plain}
    metrics[Metric.REQUESTS_PER_S] = len(requests) / span_s
    metrics[Metric.OUTPUT_TOKENS_PER_S] = sum(r.output_tokens for r in requests) / span_s
    metrics[Metric.REPEATS] = float(len(requests))
    if spec.slo_ttft_ms > 0 or spec.slo_tpot_ms > 0:
        timings = [RequestTiming(r.ttft_ms, r.tpot_ms, r.e2e_ms) for r in requests]
        metrics[Metric.GOODPUT_REQUESTS_PER_S] = goodput(timings, spec.slo_ttft_ms, spec.slo_tpot_ms, span_s)
    return metrics


def memory_metrics(calls: list[MeasuredCall]) -> dict[str, float]:
    """The KV cache at its largest (read as every call's is, when `generate` returns) and the peaks."""
    kv = max((c.kv_bytes for c in calls), key=lambda b: b.total, default=KvBytes())
    metrics = {
        Metric.KV_CACHE_BYTES: float(kv.total),
        Metric.KV_CACHE_DEVICE_BYTES: float(kv.device),
        Metric.KV_CACHE_HOST_BYTES: float(kv.host),
        Metric.PEAK_HOST_RSS_BYTES: float(max(c.peak.host_rss_bytes for c in calls)),
    }
    device = [c.peak.device_bytes for c in calls if c.peak.device_bytes is not None]
    if device:
        metrics[Metric.PEAK_DEVICE_MEM_BYTES] = float(max(device))
    paged = [c.paged for c in calls if c.paged is not None]
    if paged:
        metrics[Metric.KV_PAGES_PEAK] = float(max(p.peak_blocks for p in paged))
        metrics[Metric.KV_CACHE_IN_USE_BYTES] = metrics[Metric.KV_PAGES_PEAK] * paged[-1].block_bytes
    return metrics
