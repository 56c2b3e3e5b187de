"""What each step of a cell's measurement found, as a part of its result: the contract's metrics and the raw
samples behind them, the contention verdict, the energy and the quality check.

Each step returns a `ResultPart` and `run_cell` writes it into the result as it comes, so what was found
before a later step fails stays on the failed cell.
"""

from dataclasses import dataclass, field
from typing import Any

import torch

from kvsweep.caches import get_strategy
from kvsweep.cell.checks import QualityCheck, cell_tags
from kvsweep.cell.generate_session import MeasuredCall
from kvsweep.grid import Cell
from kvsweep.measure.bandwidth import Bandwidth, bandwidth_metrics, decode_weight_bytes
from kvsweep.measure.contention import CallContention, HostEvidence, gpu_verdict, merge
from kvsweep.measure.energy import Energy
from kvsweep.measure.gpu_sharing import GpuSharing
from kvsweep.measure.sampling import MeasuredPhase, summarize_runs
from kvsweep.models.shape import KvShape
from kvsweep.names import Metric, ResultTag
from kvsweep.plan.kv_prediction import cell_dense_kv_bytes, decode_kv_traffic
from kvsweep.results import CellResult


@dataclass(frozen=True)
class ResultPart:
    """The part of a cell's result one step found (metrics, tags, environment, samples)."""

    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)
    trials: tuple[dict[str, Any], ...] = ()


def write_part(result: CellResult, found: ResultPart) -> None:
    result.metrics.update(found.metrics)
    result.tags.update(found.tags)
    result.environment.update(found.environment)
    result.samples.update(found.samples)
    result.trials.extend(found.trials)


def numbers_found(
    cell: Cell,
    first: MeasuredCall,
    phase: MeasuredPhase[MeasuredCall],
    quality: dict[str, float],
    model: torch.nn.Module,
    shape: KvShape,
    bandwidth: Bandwidth,
) -> ResultPart:
    """The contract's metrics, the checks' tags and the raw samples behind them."""
    strategy = get_strategy(cell.cache)
    runs = [sample.call for sample in phase.kept]
    kv = runs[-1].kv_bytes
    metrics = {
        **summarize_runs([(r.times, r.peak) for r in runs], cell),
        **quality,
        Metric.FIRST_CALL_MS: first.times.e2e_ms,
        Metric.KV_CACHE_BYTES: float(kv.total),
        Metric.KV_CACHE_DEVICE_BYTES: float(kv.device),
        Metric.KV_CACHE_HOST_BYTES: float(kv.host),
        Metric.KV_CACHE_BYTES_DENSE: float(cell_dense_kv_bytes(cell, shape)),
    }
    kv_traffic = decode_kv_traffic(
        strategy, shape, cell.batch_size, cell.dtype, cell.context_length, cell.max_new_tokens
    )
    device_per_token = decode_weight_bytes(model) + kv_traffic.device_bytes
    metrics.update(bandwidth_metrics(device_per_token, metrics[Metric.TPOT_MS], bandwidth, kv_traffic.host_link_bytes))
    tags = cell_tags(runs, metrics, bandwidth)
    if (paged := runs[-1].paged) is not None:
        metrics[Metric.KV_PAGES_PEAK] = float(max(r.paged.peak_blocks for r in runs if r.paged is not None))
        metrics[Metric.KV_CACHE_IN_USE_BYTES] = metrics[Metric.KV_PAGES_PEAK] * paged.block_bytes
        tags[ResultTag.PAGED_POOL] = f"{paged.pool.describe()} usable_blocks={paged.usable_blocks} " + (
            f"attention={paged.attention}"
        )
    samples = {
        "first_call": call_samples(first),
        "repeats": [call_samples(s.call, s.contention) for s in phase.kept],
        "discarded": [call_samples(s.call, s.contention) for s in phase.discarded],
    }
    return ResultPart(metrics, tags, samples=samples)


def noise_found(phase: MeasuredPhase[MeasuredCall], host: HostEvidence, gpu: GpuSharing | None) -> ResultPart:
    """One contention verdict from the host's counters and (CUDA) NVML, the shares, the precision target."""
    gpu_seen = gpu_verdict(gpu.verdict, gpu.seen_on) if gpu is not None else None
    contended, contention = merge(host.verdict(), gpu_seen)
    tags = {ResultTag.CONTENDED: contended, ResultTag.CONTENTION: contention}
    if phase.target_met is not None:
        tags[ResultTag.CI_TARGET] = "met" if phase.target_met else "missed"
    environment = gpu.record() if gpu is not None else {}  # gpu_other_pids, and what each GPU's checks found
    metrics = {**host.metrics(), Metric.DISCARDED_CALLS: float(len(phase.discarded))}
    return ResultPart(metrics, tags, environment)


def energy_found(energy: Energy) -> ResultPart:
    if energy.joules_per_token is None:
        return ResultPart(tags={ResultTag.ENERGY: f"unknown: {energy.unknown}"})
    return ResultPart({Metric.JOULES_PER_TOKEN: energy.joules_per_token}, samples={"energy": energy.record()})


def quality_found(quality: QualityCheck) -> ResultPart:
    tags = {ResultTag.QUALITY: quality.not_measured} if quality.not_measured else {}
    environment = {"quality_forward": quality.forward} if quality.forward else {}
    return ResultPart(tags=tags, environment=environment, trials=quality.trials)


def call_samples(call: MeasuredCall, contention: CallContention | None = None) -> dict[str, Any]:
    """One call's raw numbers; measured calls add what others took of the CPUs meanwhile (None: unreadable)."""
    samples: dict[str, Any] = {
        Metric.TTFT_MS: call.times.ttft_ms,
        "gaps_ms": call.times.gaps_ms,
        Metric.E2E_MS: call.times.e2e_ms,
        Metric.PEAK_HOST_RSS_BYTES: call.peak.host_rss_bytes,
        Metric.PEAK_DEVICE_MEM_BYTES: call.peak.device_bytes,
    }
    if call.peak.device_bytes_each is not None:  # a model over several GPUs: each one's peak
        samples["peak_device_mem_bytes_per_gpu"] = call.peak.device_bytes_each
    return samples | (contention.to_dict() if contention is not None else {})
