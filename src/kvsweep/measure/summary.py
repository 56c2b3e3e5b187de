"""Turn a cell's measured calls into the contract's metrics (medians, p90s, rates, agreement)."""

import torch

from kvsweep.grid import Cell
from kvsweep.measure.peak_memory import PeakMemory
from kvsweep.measure.statistics import interval_metrics, median, percentile
from kvsweep.measure.timing import TokenTimes
from kvsweep.names import Metric


def summarize_runs(runs: list[tuple[TokenTimes, PeakMemory]], cell: Cell) -> dict[str, float]:
    """Medians over repeats with their 95% intervals (`*_ci_low/high`); `tpot_ms_p90` is the 90th
    percentile of every decode gap (token tail)."""
    times = [t for t, _ in runs]
    ttft = [t.ttft_ms for t in times]
    tpot = [t.tpot_ms for t in times]
    decode_rate = [cell.batch_size * len(t.gaps_ms) / (t.decode_ms / 1e3) for t in times if t.decode_ms > 0]
    prefill_rate = [cell.batch_size * cell.context_length / (t.ttft_ms / 1e3) for t in times]
    metrics = {
        Metric.TTFT_MS: median(ttft),
        Metric.TTFT_MS_P90: percentile(ttft, 90),
        Metric.TPOT_MS: median(tpot),
        Metric.TPOT_MS_P90: percentile([g for t in times for g in t.gaps_ms], 90),
        Metric.PREFILL_TOKENS_PER_S: median(prefill_rate),
        Metric.E2E_MS: median([t.e2e_ms for t in times]),
        Metric.PEAK_HOST_RSS_BYTES: median([float(p.host_rss_bytes) for _, p in runs]),
        Metric.REPEATS: float(len(runs)),
    }
    metrics |= interval_metrics(Metric.TTFT_MS, ttft) | interval_metrics(Metric.E2E_MS, [t.e2e_ms for t in times])
    if all(t.gaps_ms for t in times):
        metrics |= interval_metrics(Metric.TPOT_MS, tpot)
    if decode_rate:
        metrics[Metric.DECODE_TOKENS_PER_S] = median(decode_rate)
    device_peaks = [float(p.device_bytes) for _, p in runs if p.device_bytes is not None]
    if device_peaks:
        metrics[Metric.PEAK_DEVICE_MEM_BYTES] = median(device_peaks)
    return metrics


def token_agreement(tokens: torch.Tensor, baseline: torch.Tensor) -> dict[str, float]:
    """Share of generated positions equal to the baseline, and the first position that differs."""
    equal = tokens == baseline
    per_position = equal.all(dim=0)
    diverged = (~per_position).nonzero()
    first = int(diverged[0, 0]) if diverged.numel() else tokens.shape[1]
    return {Metric.TOKEN_AGREEMENT: float(equal.float().mean()), Metric.FIRST_DIVERGENCE: float(first)}
