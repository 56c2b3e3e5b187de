"""Measure one cell inside its actor: load, cold call, warmups, measured repeats, checks, baseline.

Returns a plain `CellResult`; never touches MLflow. Statistics come from `measure/summary.py`, the calls
from `generate_session.py`, the checks of what ran from `checks.py`.
"""

import contextlib
import os
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvsweep.caches import CacheStrategy, get_strategy, register
from kvsweep.cell.call_inputs import feed_for
from kvsweep.cell.checks import cell_tags, check_cache, check_compiled, check_cudagraphs_used, check_no_recapture
from kvsweep.cell.environment import describe_device, describe_host, recorded_gpu_uuids, start_device
from kvsweep.cell.generate_session import GenerateSession, MeasuredCall
from kvsweep.cell.memory_limit import memory_limit
from kvsweep.cell.process import out_of_memory, resolve_threads
from kvsweep.cell.quality_check import QualityCheck, quality_or_nothing
from kvsweep.cell.split import cell_devices, cell_split, placement_record
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, Cell, MeasureProtocol, cell_id
from kvsweep.measure.bandwidth import Bandwidth, device_bandwidth
from kvsweep.measure.compile_events import compile_events, cudagraph_skips
from kvsweep.measure.contention import CallContention, HostEvidence, HostMeter, gpu_verdict, merge
from kvsweep.measure.decode_bound import bandwidth_metrics, decode_weight_bytes
from kvsweep.measure.energy import Energy, EnergyMeter, nvml_energy_counter, phase_energy
from kvsweep.measure.gpu_sharing import SharingProbe
from kvsweep.measure.peak_memory import CudaMemory
from kvsweep.measure.sampling import MeasuredPhase, SamplingRules, measure_phase
from kvsweep.measure.summary import summarize_runs
from kvsweep.models.build import build_model, torch_dtype_of
from kvsweep.models.device_map import Split, build_split_model
from kvsweep.models.gguf_source import weights_origin
from kvsweep.models.resolve import cached_model, classify, hub_cache_folder, hub_repo, kv_shape
from kvsweep.models.shape import KvShape
from kvsweep.models.weight_schemes import prequantized_label, stored_bytes
from kvsweep.names import INPUTS_SHA256_PARAM, Metric, ResultTag
from kvsweep.plan.cell_plan import package_installed, skip_reason
from kvsweep.plan.kv_prediction import cell_dense_kv_bytes, decode_kv_traffic
from kvsweep.plan.sharding import layers_text
from kvsweep.results import ERROR, OK, OOM, SKIPPED, CellResult
from kvsweep.testing.faults import cuda_init_for, fault_for

MAX_ERROR_CHARS = 500


def run_cell(
    cell_data: dict[str, Any],
    protocol_data: dict[str, Any],
    faults: list[dict[str, Any]] | None = None,
    trust_remote_code: bool = False,
    wait_idle_gpu_s: float = 0.0,
    on_phase: Callable[[str], None] | None = None,
    strategies: list[CacheStrategy] | None = None,
    cpus_per_cell: int = 0,
    hub_cache: dict[str, str] | None = None,
    split_devices: int = 0,
) -> dict[str, Any]:
    """Entry point for the actor: plain dicts in, a plain dict out.

    `on_phase(name)` is called at "built", "measuring" (it may block: the actor's gate) and "measured".
    `strategies` are those the driver registered beyond the built-ins: this process learns them first.
    `cpus_per_cell` is what Ray reserved for the cell (0: not known), for `resolve_threads`.
    `hub_cache`: Hub models the driver fetched before any cell, each with the cache it fetched into ("": this
    node's default); the cell loads them from that cached snapshot, with no request to the Hub.
    `split_devices`: the `testing.split_devices` seam (the model placed over that many CPU devices).
    Everything after reading the cell is inside the `try`: whatever fails (CUDA that cannot start
    included) makes an `error` (or `oom`) result with its message, carrying the environment found so far.
    """
    cell, protocol = Cell(**cell_data), MeasureProtocol.from_dict(protocol_data)
    result = CellResult(cell_id(cell, protocol), cell, OK)
    faults = faults or []
    try:
        for strategy in strategies or []:
            register(strategy)
        allowed_cpus = len(os.sched_getaffinity(0))
        threads = resolve_threads(
            protocol.device, protocol.threads, cpus_per_cell, os.environ.get("OMP_NUM_THREADS"), allowed_cpus
        )
        torch.set_num_threads(threads.count)
        warnings.filterwarnings("ignore")
        result.environment.update(describe_host(protocol.device), threads_from=threads.source)  # threads: set above
        start_device(protocol.device, cuda_init_for(fault_for(cell.to_dict(), faults, during="start")))
        result.environment.update(describe_device(protocol.device, protocol.gpus))  # each of the cell's GPUs
        if protocol.device_memory_limit_gb > 0:
            device_bandwidth(protocol.device)  # our probe's two buffers (per process): before the limit, not under it
        limit = protocol.device_memory_limit_gb
        with memory_limit(protocol.device, limit, protocol.gpus) as applied:  # lifted before the result
            if applied is not None:
                result.tags[ResultTag.MEMORY_LIMIT] = applied
            phase = on_phase or (lambda _: None)
            _measure(
                cell, protocol, faults, trust_remote_code, wait_idle_gpu_s, result, phase, hub_cache, split_devices
            )
    except Exception as exc:
        kind = out_of_memory(exc, protocol.device)
        record_failure(result, OOM if kind else ERROR, exc)
        if kind:
            result.tags[ResultTag.OOM_KIND] = kind
    return result.to_dict()


def sampling_rules(protocol: MeasureProtocol, niceness: int) -> SamplingRules:
    """The protocol's rules for this process; a niced process yields to anyone, so it tolerates no one."""
    return SamplingRules(
        repeats=protocol.repeats,
        min_duration_s=protocol.min_duration_s,
        repeat_cap=protocol.repeat_cap,
        max_contention=0.0 if niceness > 0 else protocol.max_host_contention,
        max_discarded=protocol.max_discarded,
        target_rel_ci=protocol.target_rel_ci,
        max_duration_s=protocol.max_duration_s,
    )


def release_cuda_cache() -> None:
    """CUDA's cached memory back to the driver, only once CUDA has started: asking `is_available` would
    start it, and it may be what failed."""
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def record_failure(
    result: CellResult,
    status: str,
    exc: BaseException,
    release_device_memory: Callable[[], None] = release_cuda_cache,
) -> None:
    """The cell failed: its status, the exception's message and traceback; then its device memory freed.

    After a sticky CUDA error (an illegal memory access, a device-side assert) every CUDA call raises it
    again, `empty_cache` included: the failure is written first, and a release that fails is ignored,
    so the cell still ends as its own error rather than as whatever the release raised.
    """
    result.status = status
    result.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    result.traceback = "".join(traceback.format_exception(exc))[-8000:]
    with contextlib.suppress(Exception):
        release_device_memory()


def _measure(
    cell: Cell,
    protocol: MeasureProtocol,
    faults: list[dict[str, Any]],
    trust_remote_code: bool,
    wait_idle_gpu_s: float,
    result: CellResult,
    on_phase: Callable[[str], None],
    hub_cache: dict[str, str] | None = None,
    split_devices: int = 0,
) -> None:
    """The one place that writes the cell's result: each step returns what it found, written here as it
    comes, so what was found before a step that fails (the load time, the compiled graphs, the noise
    verdict) stays on the failed cell."""
    strategy = get_strategy(cell.cache)
    device = protocol.device
    source = fetched_source(cell, hub_cache or {})
    loaded = _load(cell, protocol, trust_remote_code, on_phase, source, split_devices)
    if isinstance(loaded, str):
        result.status, result.error = SKIPPED, loaded
        return
    result.metrics[Metric.MODEL_LOAD_S] = loaded.seconds
    result.metrics[Metric.WEIGHTS_BYTES] = float(stored_bytes(loaded.model))
    if cell.weights == NO_WEIGHT_QUANTIZATION and (label := prequantized_label(loaded.model.config.to_dict())):
        result.tags[ResultTag.CHECKPOINT_QUANTIZATION] = label  # loaded as its checkpoint has it
    result.environment.update(weights_origin(classify(source.model).reference))  # a GGUF file: its name and type
    if loaded.split is not None:
        result.tags[ResultTag.PLACEMENT] = layers_text(loaded.split.loads)
        result.samples["placement"] = placement_record(loaded.split)
    model, shape = loaded.model, loaded.shape
    feed = feed_for(source, protocol, model.config.vocab_size, trust_remote_code)
    if isinstance(feed, str):
        result.status, result.error = SKIPPED, feed
        return
    result.environment[INPUTS_SHA256_PARAM] = feed.sha256
    bandwidth = device_bandwidth(device)  # once per process, before anything is timed
    injected = fault_for(cell.to_dict(), faults), fault_for(cell.to_dict(), faults, during="quality")
    gpus = len(loaded.split.devices) if loaded.split is not None and session_on_cuda(device) else 1
    session = GenerateSession(
        model, feed.ids, cell, device, *injected, device_memory=CudaMemory(gpus) if gpus > 1 else None
    )
    if cell.compile and not session_on_cuda(device):
        session.compile_forward()
    skips_before = cudagraph_skips() if cell.compile else 0  # a graph skipped when compiled stays skipped

    first = session.call(strategy)
    check_cache(strategy, first, cell)  # fail fast, before any measuring time is spent
    if cell.compile:
        result.environment["compiled_graphs"] = check_compiled(strategy, session)
    for _ in range(protocol.warmup):
        session.call(strategy)
    on_phase("measuring")
    sharing = SharingProbe(recorded_gpu_uuids(result.environment))  # each of the cell's GPUs
    sharing.wait_until_alone(wait_idle_gpu_s)
    sharing.check()  # before and after the measured phase
    niceness = int(result.environment.get("niceness", 0))
    compiled_before = compile_events() if cell.compile else 0
    energy = EnergyMeter(nvml_energy_counter(device, recorded_gpu_uuids(result.environment)))  # summed over them
    energy.start()
    phase = measure_phase(
        energy.each(lambda: session.call(strategy)),
        lambda c: c.times,
        sampling_rules(protocol, niceness),
        HostMeter(),
        energy.paused(time.sleep),
    )
    _write(result, _energy_found(phase_energy(energy, phase, lambda c: c.new_tokens.numel())))
    recaptures = compile_events() - compiled_before if cell.compile else 0
    skips = cudagraph_skips() - skips_before if cell.compile else 0
    sharing.check()
    on_phase("measured")
    for sample in phase.kept:
        check_cache(strategy, sample.call, cell)
    host = HostEvidence([s.contention for s in phase.kept], protocol.max_host_contention, niceness)
    _write(result, _noise(phase, host, sharing if session_on_cuda(device) else None))
    checked_at = time.perf_counter()
    new_tokens = phase.kept[-1].call.new_tokens
    quality = quality_or_nothing(session, strategy, new_tokens, model.config.vocab_size, feed, protocol.seed)
    result.metrics[Metric.QUALITY_CHECK_S] = time.perf_counter() - checked_at
    _write(result, _quality_found(quality))
    _write(result, _numbers(cell, first, phase, quality.metrics, model, shape, bandwidth))
    if cell.compile:
        result.metrics[Metric.COMPILE_RECAPTURES] = float(recaptures)
        result.metrics[Metric.COMPILE_CUDAGRAPH_SKIPS] = float(skips)
        check_no_recapture(recaptures)  # after recording: the numbers stay, the cell fails
        check_cudagraphs_used(skips, session_on_cuda(device))


@dataclass(frozen=True)
class ResultPart:
    """The part of a cell's result one step found (metrics, tags, environment, samples)."""

    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)
    trials: tuple[dict[str, Any], ...] = ()


def _write(result: CellResult, found: ResultPart) -> None:
    result.metrics.update(found.metrics)
    result.tags.update(found.tags)
    result.environment.update(found.environment)
    result.samples.update(found.samples)
    result.trials.extend(found.trials)


def _numbers(
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
    samples = {
        "first_call": _call_samples(first),
        "repeats": [_call_samples(s.call, s.contention) for s in phase.kept],
        "discarded": [_call_samples(s.call, s.contention) for s in phase.discarded],
    }
    return ResultPart(metrics, cell_tags(runs, metrics, bandwidth), samples=samples)


def _noise(phase: MeasuredPhase[MeasuredCall], host: HostEvidence, gpu: SharingProbe | None) -> ResultPart:
    """One contention verdict from the host's counters and (CUDA) NVML, the shares, the precision target."""
    gpu_seen = gpu_verdict(gpu.verdict, gpu.seen_on) if gpu is not None else None
    contended, contention = merge(host.verdict(), gpu_seen)
    tags = {ResultTag.CONTENDED: contended, ResultTag.CONTENTION: contention}
    if phase.target_met is not None:
        tags[ResultTag.CI_TARGET] = "met" if phase.target_met else "missed"
    environment = gpu.record() if gpu is not None else {}  # gpu_other_pids, and what each GPU's checks found
    metrics = {**host.metrics(), Metric.DISCARDED_CALLS: float(len(phase.discarded))}
    return ResultPart(metrics, tags, environment)


def _energy_found(energy: Energy) -> ResultPart:
    if energy.joules_per_token is None:
        return ResultPart(tags={ResultTag.ENERGY: f"unknown: {energy.unknown}"})
    return ResultPart({Metric.JOULES_PER_TOKEN: energy.joules_per_token}, samples={"energy": energy.record()})


def _quality_found(quality: QualityCheck) -> ResultPart:
    tags = {ResultTag.QUALITY: quality.not_measured} if quality.not_measured else {}
    environment = {"quality_forward": quality.forward} if quality.forward else {}
    return ResultPart(tags=tags, environment=environment, trials=quality.trials)


@dataclass(frozen=True)
class Loaded:
    model: torch.nn.Module
    shape: KvShape
    seconds: float  # building it (`model_load_s`)
    split: Split | None = None  # placed over several devices


def fetched_source(cell: Cell, hub_cache: dict[str, str]) -> Cell:
    """The cell with its model read from where it lies: a Hub model the driver fetched, as its cached
    snapshot's folder (the weights and tokenizer then load with no request to the Hub); any other as it is."""
    if cell.model not in hub_cache:
        return cell
    snapshot = cached_model(cell.model, hub_cache[cell.model] or None)  # a GGUF model: its file in the snapshot
    if snapshot is None:
        where = hub_cache_folder(hub_repo(cell.model), hub_cache[cell.model] or None)
        raise RuntimeError(f"{cell.model} was fetched before the sweep, but {where} has no snapshot of it on this node")
    return replace(cell, model=str(snapshot))


def _load(
    cell: Cell,
    protocol: MeasureProtocol,
    trust_remote_code: bool,
    on_phase: Callable[[str], None],
    source: Cell | None = None,
    split_devices: int = 0,
) -> Loaded | str:
    """The cell's model on its device (or its devices), or why the cell is skipped (found before or after
    building it). `source`: the cell with its model where it is read from (`fetched_source`);
    `split_devices`: the seam that splits it over that many CPU devices."""
    device = protocol.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("cell planned for CUDA but this worker has no usable GPU")
    reason = skip_reason(cell, device, None, package_installed)
    if reason is not None:
        return reason
    loaded_at = time.perf_counter()
    ref = classify((source or cell).model)
    devices = cell_devices(protocol, split_devices)
    split = cell_split(cell, ref, devices, trust_remote_code) if devices else None
    if split is not None:
        dtype = torch_dtype_of(cell.dtype)
        model, _ = build_split_model(ref, dtype, protocol.seed, split, trust_remote_code, cell.weights)
    else:
        model = build_model(ref, cell.dtype, device, protocol.seed, trust_remote_code, cell.weights)
    seconds = time.perf_counter() - loaded_at
    on_phase("built")
    shape = kv_shape(model.config)
    reason = skip_reason(cell, device, shape, package_installed)
    return reason if reason is not None else Loaded(model, shape, seconds, split)


def _call_samples(call: MeasuredCall, contention: CallContention | None = None) -> dict[str, Any]:
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


def session_on_cuda(device: str) -> bool:
    return device == "cuda" and torch.cuda.is_available()
