"""Measure one cell inside its actor: load, cold call, warmups, measured repeats, baseline.

Returns a plain `CellResult`; never touches MLflow. Statistics come from `summarize.py`.
"""

import os
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from kvsweep.caches import CacheStrategy, get_strategy
from kvsweep.environment import describe_environment
from kvsweep.estimate import dense_kv_bytes
from kvsweep.faults import InjectFault, fault_for
from kvsweep.grid import Cell, Protocol, cell_id
from kvsweep.measure.gpu_sharing import SharingProbe
from kvsweep.measure.kv_bytes import cache_bytes
from kvsweep.measure.memory import PeakMemory, track_peak_memory
from kvsweep.measure.quality import record_reference, reference_rows, teacher_forced_kl
from kvsweep.measure.timing import TokenClock, TokenTimes
from kvsweep.models.build import build_model
from kvsweep.models.resolve import classify, kv_shape
from kvsweep.plan import package_installed, skip_reason
from kvsweep.results import ERROR, OK, OOM, SKIPPED, CellResult
from kvsweep.summarize import summarize_runs, token_agreement

MAX_ERROR_CHARS = 500


@dataclass
class MeasuredCall:
    times: TokenTimes
    peak: PeakMemory
    new_tokens: torch.Tensor
    cache: Any


class GenerateSession:
    """Runs `generate` for one cell the same way every time, with the token clock attached."""

    def __init__(
        self,
        model: PreTrainedModel,
        inputs: torch.Tensor,
        cell: Cell,
        device: str,
        fault: str | None,
        quality_fault: str | None = None,
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.mask = torch.ones_like(inputs)
        self.cell = cell
        self.cuda = device == "cuda"
        self.clock = TokenClock(cuda=self.cuda)
        processors: list[Any] = [self.clock]
        if fault is not None:
            processors.append(InjectFault(fault))
        self.processors = LogitsProcessorList(processors)
        self.quality_fault = quality_fault

    def generation_config(self, strategy: CacheStrategy) -> GenerationConfig:
        compile_config = None
        if self.cell.compile and self.cuda:
            from transformers import CompileConfig

            compile_config = CompileConfig(fullgraph=True)
        return GenerationConfig(
            max_new_tokens=self.cell.max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            return_dict_in_generate=True,
            # Generation compiles static caches by itself on CUDA; only do it when the cell asks.
            disable_compile=compile_config is None,
            compile_config=compile_config,
            **strategy.generation_options(),
        )

    @torch.inference_mode()
    def call(self, strategy: CacheStrategy) -> MeasuredCall:
        config = self.generation_config(strategy)
        with track_peak_memory(self.cuda) as peak:
            self.clock.start()
            out = self.model.generate(
                self.inputs,
                attention_mask=self.mask,
                generation_config=config,
                logits_processor=self.processors,
            )
            end_ns = self.clock.stop()
        times = TokenTimes.from_clock(self.clock.start_ns, self.clock.stamps_ns, end_ns)
        new_tokens = out.sequences[:, self.inputs.shape[1] :]
        if new_tokens.shape[1] != self.cell.max_new_tokens:
            raise RuntimeError(f"generated {new_tokens.shape[1]} tokens, asked for {self.cell.max_new_tokens}")
        return MeasuredCall(times, peak, new_tokens.cpu(), out.cache)

    @torch.inference_mode()
    def generate_with(self, strategy: CacheStrategy, processors: LogitsProcessorList) -> torch.Tensor:
        """An unmeasured call with other logits processors (quality checks); returns the new tokens."""
        if self.quality_fault is not None:
            processors = LogitsProcessorList([*processors, InjectFault(self.quality_fault)])
        out = self.model.generate(
            self.inputs,
            attention_mask=self.mask,
            generation_config=self.generation_config(strategy),
            logits_processor=processors,
        )
        return out.sequences[:, self.inputs.shape[1] :].cpu()


def make_inputs(vocab_size: int, batch: int, context: int, seed: int, device: str) -> torch.Tensor:
    """Seeded random token ids, the same for every strategy of a (batch, context) pair."""
    generator = torch.Generator().manual_seed(seed + 7919 * context + batch)
    return torch.randint(0, vocab_size, (batch, context), generator=generator).to(device)


def resolve_threads(requested: int) -> int:
    """0 means every core this process may run on (Ray narrows OMP_NUM_THREADS to num_cpus)."""
    return requested if requested > 0 else len(os.sched_getaffinity(0))


def run_cell(
    cell_data: dict[str, Any],
    protocol_data: dict[str, Any],
    faults: list[dict[str, Any]] | None = None,
    trust_remote_code: bool = False,
    wait_idle_gpu_s: float = 0.0,
    on_phase: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Entry point for the actor: plain dicts in, a plain dict out.

    `on_phase(name)` is called at "built", "measuring" (it may block: the actor's gate) and "measured".
    """
    cell, protocol = Cell(**cell_data), Protocol(**protocol_data)
    torch.set_num_threads(resolve_threads(protocol.threads))
    warnings.filterwarnings("ignore")
    result = CellResult(cell_id(cell, protocol), cell.to_dict(), OK)
    result.environment = describe_environment(protocol.device)
    try:
        _measure(cell, protocol, faults or [], trust_remote_code, wait_idle_gpu_s, result, on_phase or (lambda _: None))
    except torch.OutOfMemoryError as exc:
        _fail(result, OOM, exc)
        result.tags["kvsweep.oom_kind"] = "device"
    except RuntimeError as exc:
        out_of_memory = "out of memory" in str(exc).lower()
        _fail(result, OOM if out_of_memory else ERROR, exc)
        if out_of_memory:
            result.tags["kvsweep.oom_kind"] = "device" if protocol.device == "cuda" else "host"
    except Exception as exc:
        _fail(result, ERROR, exc)
    return result.to_dict()


def measured_runs(call: Callable[[], MeasuredCall], protocol: Protocol) -> list[MeasuredCall]:
    """At least `repeats` runs and at least `min_duration_s` of them, at most `repeat_cap` runs.

    A fixed count alone gives a 20 ms cell a median of a few noisy samples and a 20 s cell more
    than it needs; a time floor, as the best benchmark harnesses use, evens out the confidence.
    """
    runs: list[MeasuredCall] = []
    started = time.perf_counter()
    while len(runs) < protocol.repeats or (
        time.perf_counter() - started < protocol.min_duration_s and len(runs) < protocol.repeat_cap
    ):
        runs.append(call())
    return runs


def _fail(result: CellResult, status: str, exc: BaseException) -> None:
    result.status = status
    result.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    result.traceback = "".join(traceback.format_exception(exc))[-8000:]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _measure(
    cell: Cell,
    protocol: Protocol,
    faults: list[dict[str, Any]],
    trust_remote_code: bool,
    wait_idle_gpu_s: float,
    result: CellResult,
    on_phase: Callable[[str], None],
) -> None:
    strategy = get_strategy(cell.cache)
    device = protocol.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("cell planned for CUDA but this worker has no usable GPU")
    reason = skip_reason(cell, device, None, package_installed)
    if reason is not None:
        result.status, result.error = SKIPPED, reason
        return
    loaded_at = time.perf_counter()
    model = build_model(classify(cell.model), cell.dtype, device, protocol.seed, trust_remote_code)
    load_s = time.perf_counter() - loaded_at
    on_phase("built")
    shape = kv_shape(model.config)
    reason = skip_reason(cell, device, shape, package_installed)
    if reason is not None:
        result.status, result.error = SKIPPED, reason
        return
    eager_forward = model.forward
    if cell.compile and not session_on_cuda(device):
        model.forward = torch.compile(eager_forward, dynamic=False)  # generation skips compile on CPU
    inputs = make_inputs(model.config.vocab_size, cell.batch_size, cell.context_length, protocol.seed, device)
    faulty = fault_for(cell.to_dict(), faults), fault_for(cell.to_dict(), faults, during="quality")
    session = GenerateSession(model, inputs, cell, device, *faulty)

    first = session.call(strategy)
    for _ in range(protocol.warmup):
        session.call(strategy)
    on_phase("measuring")
    sharing = SharingProbe(result.environment.get("gpu_uuid"))
    sharing.wait_until_alone(wait_idle_gpu_s)
    sharing.check()  # before and after the measured phase
    runs = measured_runs(lambda: session.call(strategy), protocol)
    sharing.check()
    on_phase("measured")
    result.tags["kvsweep.contended"] = sharing.verdict
    if sharing.seen:
        result.environment["gpu_other_pids"] = ",".join(map(str, sorted(sharing.seen)))
    last = runs[-1]
    stored = cache_bytes(last.cache)
    for run in runs:
        run.cache = None  # free the caches before the baseline allocates its own
    model.forward = eager_forward  # the baseline's growing dynamic cache would only trigger recompiles
    quality = _quality_or_nothing(session, strategy, last.new_tokens, model.config.vocab_size, result)

    result.metrics = summarize_runs([(r.times, r.peak) for r in runs], cell)
    result.metrics.update(
        first_call_ms=first.times.e2e_ms,
        kv_cache_bytes=float(stored),
        kv_cache_bytes_dense=float(dense_kv_bytes(shape, cell.cached_tokens, cell.batch_size, cell.dtype)),
        model_load_s=load_s,
        **quality,
    )
    result.samples = {
        "first_call": _call_samples(first),
        "repeats": [_call_samples(r) for r in runs],
    }


def _quality_or_nothing(
    session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int, result: CellResult
) -> dict[str, float]:
    """The quality check runs after the measurement: if its extra calls do not fit (a dynamic baseline
    where only a lean cache fits is the very case), the cell keeps its numbers and says why."""
    try:
        return _quality(session, strategy, tokens, vocab)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not isinstance(exc, torch.OutOfMemoryError) and "out of memory" not in str(exc).lower():
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        result.tags["kvsweep.quality"] = f"not measured: the quality check ran out of memory ({type(exc).__name__})"
        return {}


def _quality(session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int) -> dict[str, float]:
    """Agreement with the dynamic-cache answer on the same model and inputs, and the teacher-forced KL."""
    if strategy.name == "dynamic":
        return token_agreement(tokens, tokens)
    dynamic = get_strategy("dynamic")
    rows = reference_rows(tokens.shape[0], tokens.shape[1], vocab)
    baseline, reference = record_reference(lambda p: session.generate_with(dynamic, p), rows)
    prompt_length = session.inputs.shape[1]
    kl = teacher_forced_kl(lambda p: session.generate_with(strategy, p), baseline, reference, prompt_length)
    return {**token_agreement(tokens, baseline), **kl}


def _call_samples(call: MeasuredCall) -> dict[str, Any]:
    return {
        "ttft_ms": call.times.ttft_ms,
        "gaps_ms": call.times.gaps_ms,
        "e2e_ms": call.times.e2e_ms,
        "peak_host_rss_bytes": call.peak.host_rss_bytes,
        "peak_device_mem_bytes": call.peak.device_bytes,
    }


def session_on_cuda(device: str) -> bool:
    return device == "cuda" and torch.cuda.is_available()
