"""Measure one cell inside its actor: load, cold call, warmups, measured repeats, checks, baseline.

Returns a plain `CellResult`; never touches MLflow. The model comes from `model_load.py`, the calls from
`generate_session.py`, the meters around the measured phase from `measure/phase_meters.py`, what each step
found from `result_parts.py`, the checks of what ran from `checks.py`.
"""

import contextlib
import os
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from kvsweep.caches import get_strategy, register
from kvsweep.cell.call_inputs import Feed, feed_for
from kvsweep.cell.checks import (
    check_cache,
    check_compiled,
    check_cudagraphs_used,
    check_no_recapture,
    quality_or_nothing,
)
from kvsweep.cell.cpu_slots import resolve_threads
from kvsweep.cell.environment import describe_device, describe_host, recorded_gpu_uuids, start_device
from kvsweep.cell.generate_session import GenerateSession
from kvsweep.cell.memory_limit import memory_limit
from kvsweep.cell.model_load import Loaded, fetched_source, load_cell_model, placement_record
from kvsweep.cell.paged_session import PagedSession
from kvsweep.cell.request import CellRequest
from kvsweep.cell.result_parts import energy_found, noise_found, numbers_found, quality_found, write_part
from kvsweep.cell.workload_cell import measure_workload
from kvsweep.cell.workload_text import encode_requests, score_answers
from kvsweep.errors import out_of_memory
from kvsweep.grid import NO_WEIGHT_QUANTIZATION
from kvsweep.inputs.spec import RANDOM
from kvsweep.measure.bandwidth import Bandwidth, device_bandwidth
from kvsweep.measure.contention import HostEvidence, HostMeter
from kvsweep.measure.energy import nvml_energy_counter
from kvsweep.measure.gpu_sharing import SharingProbe
from kvsweep.measure.peak_memory import CudaMemory
from kvsweep.measure.phase_meters import PhaseMeters, compile_events, cudagraph_skips
from kvsweep.models.gguf_source import weights_origin
from kvsweep.models.quantize_weights import prequantized_label, stored_bytes
from kvsweep.models.resolve import classify, load_tokenizer
from kvsweep.models.sharding import layers_text
from kvsweep.names import INPUTS_SHA256_PARAM, Metric, ResultTag
from kvsweep.results import ERROR, OK, OOM, SKIPPED, CellResult
from kvsweep.testing.faults import cuda_init_for, fault_for

MAX_ERROR_CHARS = 500


def run_cell(request: CellRequest, on_phase: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Entry point for the actor: the cell's request in, a plain dict out.

    `on_phase(name)` is called at "built", "measuring" (it may block: the actor's gate) and "measured". The
    driver's registered strategies are learnt first. Everything after reading the cell is inside the `try`:
    whatever fails (CUDA that cannot start included) makes an `error` (or `oom`) result with its message,
    carrying the environment found so far.
    """
    cell, protocol, options, faults = request.cell, request.protocol, request.options, request.seams.faults
    result = CellResult(request.cell_id, cell, OK)
    try:
        for strategy in options.strategies:
            register(strategy)
        allowed_cpus = len(os.sched_getaffinity(0))
        threads = resolve_threads(
            protocol.device,
            protocol.measure.threads,
            options.cpus_per_cell,
            os.environ.get("OMP_NUM_THREADS"),
            allowed_cpus,
        )
        torch.set_num_threads(threads.count)
        warnings.filterwarnings("ignore")
        result.environment.update(describe_host(protocol.device), threads_from=threads.source)  # threads: set above
        start_device(protocol.device, cuda_init_for(fault_for(cell.to_dict(), faults, during="start")))
        result.environment.update(describe_device(protocol.device, protocol.gpus))  # each of the cell's GPUs
        if protocol.measure.device_memory_limit_gb > 0:
            device_bandwidth(protocol.device)  # our probe's two buffers (per process): before the limit, not under it
        limit = protocol.measure.device_memory_limit_gb
        with memory_limit(protocol.device, limit, protocol.gpus) as applied:  # lifted before the result
            if applied is not None:
                result.tags[ResultTag.MEMORY_LIMIT] = applied
            phase = on_phase or (lambda _: None)
            _measure(request, result, phase)
    except Exception as exc:
        kind = out_of_memory(exc, protocol.device)
        record_failure(result, OOM if kind else ERROR, exc)
        if kind:
            result.tags[ResultTag.OOM_KIND] = kind
    return result.to_dict()


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


def _measure(request: CellRequest, result: CellResult, on_phase: Callable[[str], None]) -> None:
    """The one place that writes the cell's result: each step returns what it found, written here as it
    comes, so what was found before a step that fails (the load time, the compiled graphs, the noise
    verdict) stays on the failed cell."""
    cell, protocol, faults = request.cell, request.protocol, request.seams.faults
    trust_remote_code = request.options.trust_remote_code
    strategy = get_strategy(cell.cache)
    device = protocol.device
    source = fetched_source(cell, request.options.hub_cache)
    loaded = load_cell_model(cell, protocol, trust_remote_code, on_phase, source, request.seams.split_devices)
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
    model = loaded.model
    # A workload cell's calls are fed by its replay (workload_cell.py); the session's own ids are random ones.
    fed = replace(source, inputs=RANDOM) if cell.is_workload else source
    feed = feed_for(fed, protocol, model.config.vocab_size, trust_remote_code)
    if isinstance(feed, str):
        result.status, result.error = SKIPPED, feed
        return
    result.environment[INPUTS_SHA256_PARAM] = feed.sha256
    if feed.left_out:
        result.tags[ResultTag.TASKS_LEFT_OUT] = feed.left_out
    bandwidth = device_bandwidth(device)  # once per process, before anything is timed
    injected = fault_for(cell.to_dict(), faults), fault_for(cell.to_dict(), faults, during="quality")
    gpus = len(loaded.split.devices) if loaded.split is not None and session_on_cuda(device) else 1
    session_kind = PagedSession if strategy.family == "paged" else GenerateSession
    session = session_kind(
        model, feed.ids, cell, device, *injected, device_memory=CudaMemory(gpus) if gpus > 1 else None
    )
    try:
        if cell.is_workload:
            _measure_workload_cell(request, result, on_phase, session, loaded, source.model)
        else:
            _measure_calls(request, result, on_phase, session, feed, bandwidth, loaded)
    finally:
        session.close()


def _measure_workload_cell(
    request: CellRequest,
    result: CellResult,
    on_phase: Callable[[str], None],
    session: GenerateSession,
    loaded: Loaded,
    tokenizer_from: str,
) -> None:
    """The sweep's request mix replayed through the cell's cache and serving mode (`workload_cell.py`); a prompts
    file's answers scored on what the requests generated (`workload_text.py`)."""
    protocol, cell = request.protocol, request.cell
    spec = protocol.workload
    if spec is None:
        raise ValueError(f"workload cell {cell.label} but the sweep's protocol carries no workload")
    text = tokenizer = None
    if spec.prompts is not None:  # before anything is timed: a tokenizer that disagrees fails the cell at once
        tokenizer = load_tokenizer(classify(tokenizer_from), request.options.trust_remote_code)
        text = encode_requests(spec.prompts, tokenizer, spec.prompts.lengths[cell.model])
        result.environment[INPUTS_SHA256_PARAM] = spec.prompts.file_sha256  # what it was fed: the file
    if cell.compile and not session_on_cuda(protocol.device):
        session.compile_forward()
    on_phase("measuring")
    vocab = loaded.model.config.vocab_size
    positions = loaded.shape.max_positions
    strategy = get_strategy(cell.cache)
    metrics, samples, tags = measure_workload(session, strategy, spec, positions, vocab, protocol.measure.seed, text)
    on_phase("measured")
    result.metrics.update(metrics)
    result.samples.update(samples)
    result.tags.update(tags)
    quality = "not measured in the cell: the report compares its requests' tokens with the dynamic cell's"
    if text is not None:
        generated = [list(r["tokens"]) for r in samples["requests"]]
        outcome = score_answers(text, generated, tokenizer, protocol.measure.seed)
        result.metrics.update(outcome.metrics)
        result.trials = list(outcome.trials)
        quality = f"answers scored on the requests' own output; {quality.removeprefix('not measured in the cell: ')}"
    result.tags[ResultTag.QUALITY] = quality


def _measure_calls(
    request: CellRequest,
    result: CellResult,
    on_phase: Callable[[str], None],
    session: GenerateSession,
    feed: Feed,
    bandwidth: Bandwidth,
    loaded: Loaded,
) -> None:
    """The calls, timed and checked, then quality: what `_measure` runs once the model and inputs are ready."""
    cell, protocol = request.cell, request.protocol
    strategy, device, model, shape = get_strategy(cell.cache), protocol.device, loaded.model, loaded.shape
    if cell.compile and not session_on_cuda(device):
        session.compile_forward()
    skips_before = cudagraph_skips() if cell.compile else 0  # a graph skipped when compiled stays skipped

    first = session.call(strategy)
    check_cache(strategy, first, cell)  # fail fast, before any measuring time is spent
    if cell.compile:
        result.environment["compiled_graphs"] = check_compiled(strategy, session)
    for _ in range(protocol.measure.warmup):
        session.call(strategy)
    on_phase("measuring")
    gpu_uuids = recorded_gpu_uuids(result.environment)  # each of the cell's GPUs
    niceness = int(result.environment.get("niceness", 0))
    meters = PhaseMeters(
        SharingProbe(gpu_uuids, wait_for_idle_s=protocol.measure.wait_for_idle_gpu_s),
        nvml_energy_counter(device, gpu_uuids),  # summed over them
        HostMeter(),
    )
    compiled_before = compile_events() if cell.compile else 0
    metered = meters.measure(
        lambda: session.call(strategy),
        lambda c: c.times,
        lambda c: c.new_tokens.numel(),
        protocol.measure,
        max_contention=0.0 if niceness > 0 else None,  # a niced process yields to anyone: it tolerates no one
    )
    phase = metered.phase
    write_part(result, energy_found(metered.energy))
    recaptures = compile_events() - compiled_before if cell.compile else 0
    skips = cudagraph_skips() - skips_before if cell.compile else 0
    on_phase("measured")
    for sample in phase.kept:
        check_cache(strategy, sample.call, cell)
    host = HostEvidence([s.contention for s in phase.kept], protocol.measure.max_host_contention, niceness)
    write_part(result, noise_found(phase, host, metered.gpus if session_on_cuda(device) else None))
    checked_at = time.perf_counter()
    new_tokens = phase.kept[-1].call.new_tokens
    quality = quality_or_nothing(session, strategy, new_tokens, model.config.vocab_size, feed, protocol.measure.seed)
    result.metrics[Metric.QUALITY_CHECK_S] = time.perf_counter() - checked_at
    write_part(result, quality_found(quality))
    write_part(result, numbers_found(cell, first, phase, quality.metrics, model, shape, bandwidth))
    if cell.compile:
        result.metrics[Metric.COMPILE_RECAPTURES] = float(recaptures)
        result.metrics[Metric.COMPILE_CUDAGRAPH_SKIPS] = float(skips)
        check_no_recapture(recaptures)  # after recording: the numbers stay, the cell fails
        check_cudagraphs_used(skips, session_on_cuda(device))


def session_on_cuda(device: str) -> bool:
    return device == "cuda" and torch.cuda.is_available()
