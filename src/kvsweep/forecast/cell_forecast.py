"""A cell's seconds, forecast term by term from what the planner knows: the model's size and shape, the cell's
shape and cache, the measuring protocol, and the device's rates.

A call is a prefill (its FLOPs at the device's FLOP rate, and never less than reading the weights once at its
bandwidth, the roofline's floor for a short prompt; plus each layer's host overhead) and `new - 1` decode
steps (the weights and the cache's bytes at its bandwidth, an offloaded cache's copies at the host link's rate,
plus each layer's overhead). A cell is its start, its model's load, a compile allowance where it compiles, the cold
call, the warmup calls, the measured calls (the protocol's repeats, raised to its time floor and capped by its
ceiling, as `measure.sampling` stops) and the quality calls (the task prompts, dynamic's reference and the
teacher-forced run). A workload cell replays its mix instead: each request (sequential), each static batch padded
to its longest (batched), or batches of B sharing their decode steps (continuous).

The forecast targets `cell_wall_s`, the cell as the driver saw it, from its actor's start to its result.
"""

import math
from dataclasses import dataclass

from kvsweep.caches import BASELINE, CacheStrategy, get_strategy
from kvsweep.forecast.device_rates import DeviceRates
from kvsweep.forecast.terms import (
    Forecast,
    Term,
    decode_seconds,
    duration,
    load_seconds,
    prefill_flops,
    prefill_seconds,
)
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.shape import KvShape
from kvsweep.models.weight_layout import WeightLayout
from kvsweep.models.weight_schemes import copying_rows, quantized_weights, weight_scheme
from kvsweep.plan.kv_prediction import decode_kv_traffic
from kvsweep.plan.memory_fit import weights_bytes
from kvsweep.plan.offload import task_calls
from kvsweep.plan.workload_cells import served_strategy
from kvsweep.units import DTYPE_BYTES
from kvsweep.workload.request_mix import RequestMix
from kvsweep.workload.workload_spec import BATCHED, SEQUENTIAL, fitted

# A decode step's host overhead against a dense cache's, per family. Continuous batching's scheduler thread: 2.3x
# (BENCHMARKS.md, "Paged fidelity"). A quantized cache's extra work is in its step bytes (dequantizing reads and
# writes), and on this CPU little beyond them (fitted: 1.05, BENCHMARKS.md "Forecast"). Offloading's copies are
# their own term; 1.5x for its per-layer prefetch bookkeeping is a guess no run has checked. Measured on this
# project's CPU only: a device whose rates no run has calibrated (a GPU until its first run) is not given them.
STEP_OVERHEAD_FACTOR = {"quantized": 1.05, "paged": 2.3, "offloaded": 1.5}
ANSWER_TOKENS = 19  # a task trial's new tokens: a passkey's seven digits and room for a preamble (`passkey.py`)
LOGITS_PASSES = 2  # the quality check's calls: dynamic's reference and the teacher-forced run of the strategy


@dataclass(frozen=True)
class ModelCost:
    """What one model costs a forward pass: its parameters (every weight multiplies every token), the bytes its
    weights take as the cell loads them (each decode step reads them all), and its shape. A quantized model whose
    matmul first writes its weights out in the model's dtype moves `copy_bytes` more (the copy written, then read)
    in every pass of at least `copy_rows` rows: the kernel's bytes, where `weight_bytes` are the stored ones."""

    parameters: int
    weight_bytes: int
    shape: KvShape
    copy_bytes: int = 0
    copy_rows: int = 0  # 0: the kernel reads the stored bytes at any row count


def model_cost(cell: Cell, parameters: int, layout: WeightLayout | None, shape: KvShape, device_kind: str) -> ModelCost:
    """A model's cost as `cell` loads it on a `device_kind` device: its weights' stored bytes, and the copy its
    weight scheme's kernel makes there (`weight_schemes.copying_rows`)."""
    rows = copying_rows(weight_scheme(cell.weights), device_kind, cell.dtype)
    quantized = quantized_weights(layout) if layout is not None else parameters
    copy = 2 * DTYPE_BYTES[cell.dtype] * quantized if rows else 0
    return ModelCost(parameters, weights_bytes(cell, parameters, layout), shape, copy, rows)


@dataclass(frozen=True)
class CellForecast:
    """A cell's forecast (its terms) and the per-call figures behind it, set against what the cell measures."""

    forecast: Forecast
    ttft_s: float  # one call's prefill (a fixed-shape cell's `ttft_ms`)
    tpot_s: float  # one call's decode step (its `tpot_ms`)

    @property
    def seconds(self) -> float:
        return self.forecast.total

    def term(self, name: str) -> float:
        return sum(t.seconds for t in self.forecast.terms if t.name == name)


@dataclass(frozen=True)
class CallCost:
    prefill_s: float
    step_s: float

    def call(self, new: int) -> float:
        """`generate` of `new` tokens: the prefill makes the first, each further one is a decode step."""
        return self.prefill_s + max(new - 1, 0) * self.step_s


def call_cost(
    strategy: CacheStrategy, cell: Cell, model: ModelCost, rates: DeviceRates, context: int, new: int, rows: int
) -> CallCost:
    """One call's prefill and its mean decode step on `rates`."""
    shape = model.shape
    width, windows, active = shape.attention_width, shape.layer_windows, active_parameters(model.parameters, shape)
    overhead = shape.layers * rates.layer_overhead_s
    flop_rate = rates.flop_rate_of(cell.dtype)
    if strategy.implementation is None:  # no cache: every step runs the whole sequence again
        flops = prefill_flops(active, context + new // 2, shape.layers, width, rows, windows)
        step = flops / flop_rate + overhead
        return CallCost(prefill_flops(active, context, shape.layers, width, rows, windows) / flop_rate, step)
    compute = prefill_seconds(prefill_flops(active, context, shape.layers, width, rows, windows), flop_rate)
    prefill = max(compute, weights_read(model, context * rows) / rates.bandwidth)  # a short prompt reads them all
    traffic = decode_kv_traffic(strategy, shape, rows, cell.dtype, context, new)
    step = decode_seconds(
        weights_read(model, rows) + traffic.device_bytes,
        rates.bandwidth,
        traffic.host_link_bytes,
        rates.host_link,
        shape.layers
        * rates.step_layer_overhead_s(cell.compile and strategy.compilable)
        * (STEP_OVERHEAD_FACTOR.get(strategy.family, 1.0) if rates.calibrated else 1.0),
    )
    return CallCost(prefill + overhead, step)


def active_parameters(parameters: int, shape: KvShape) -> int:
    """The parameters one token multiplies: a mixture of experts routes each token to `experts_per_token` of its
    `experts` (gpt-oss-20b: 4 of 32), so the others' weights do no work for it."""
    idle = shape.layers * (shape.experts - shape.experts_per_token) * shape.expert_parameters
    return max(parameters - idle, 0) if shape.experts else parameters


def weights_read(model: ModelCost, tokens: int) -> float:
    """The weight bytes a forward pass over `tokens` tokens moves (a decode step: one a row; a prefill: every
    prompt token), as its kernels do (a dequantized copy included where the scheme makes one): all of a dense
    model's; of a mixture of experts, the shared weights and the experts its tokens are routed to. Routed evenly,
    tokens choosing k of E experts each touch E × (1 − (1 − k/E)^tokens) distinct experts a layer (one token: k;
    many: nearly all)."""
    shape = model.shape
    moved = model.weight_bytes + (model.copy_bytes if model.copy_rows and tokens >= model.copy_rows else 0)
    if not shape.experts or not model.parameters:
        return float(moved)
    missed = (1 - shape.experts_per_token / shape.experts) ** tokens
    idle = shape.layers * shape.experts * missed * shape.expert_parameters
    return moved * max(model.parameters - idle, 0) / model.parameters


def expected_measured(protocol: MeasureProtocol, call_s: float) -> int:
    """Measured calls on a quiet device: the repeats, more to fill the time floor, at most the repeat cap and what
    fits the time ceiling (a precision target is taken as met at the floor; contended calls as none)."""
    m = protocol.measure
    count = max(m.repeats, math.ceil(m.min_duration_s / call_s) if call_s > 0 else m.repeats)
    count = min(count, m.repeat_cap)
    if m.max_duration_s > 0 and call_s > 0:
        count = min(count, max(m.repeats, math.ceil(m.max_duration_s / call_s)))
    return count


def forecast_cell(
    cell: Cell, protocol: MeasureProtocol, model: ModelCost, rates: DeviceRates, compile_s: float | None = None
) -> CellForecast:
    """`compile_s`: a compiled cell of this model measured already (its cold call), else the device's allowance."""
    strategy = get_strategy(cell.cache)
    start = [
        Term("start", rates.start_s, "actor, device set-up and probes"),
        Term(
            "load",
            load_seconds(model.weight_bytes, rates.load_rate),
            f"{model.weight_bytes / 1e9:.2g} GB at {_rate(rates)}",
        ),
    ]
    compiled = compile_s if compile_s is not None else rates.compile_allowance_s
    if cell.is_workload:
        return _workload(cell, protocol, model, rates, strategy, start, compiled)
    cost = call_cost(strategy, cell, model, rates, cell.context_length, cell.max_new_tokens, cell.batch_size)
    call = cost.call(cell.max_new_tokens)
    terms = [*start]
    if cell.compile:
        terms.append(Term("compile", compiled, "measured" if compile_s is not None else "allowance"))
    terms.append(Term("cold call", call, _call_text(cost, cell.max_new_tokens)))
    warmup = protocol.measure.warmup
    terms.append(Term("warmup", warmup * call, f"{warmup} × {duration(call)}"))
    measured = expected_measured(protocol, call)
    terms.append(Term("measured", measured * call, f"{measured} × {duration(call)}"))
    terms.append(_quality(cell, protocol, strategy, model, rates, call))
    return CellForecast(Forecast(tuple(terms)), cost.prefill_s, cost.step_s)


def _quality(
    cell: Cell, protocol: MeasureProtocol, strategy: CacheStrategy, model: ModelCost, rates: DeviceRates, call: float
) -> Term:
    """The task's calls (the cell's own strategy) and, beside dynamic, its reference and teacher-forced calls."""
    tasks = task_calls(cell, protocol)
    answer = call_cost(strategy, cell, model, rates, cell.context_length, ANSWER_TOKENS, cell.batch_size)
    passes = 0 if strategy.name == BASELINE else (LOGITS_PASSES if strategy.takes_logits_processors else 1)
    seconds = tasks * answer.call(ANSWER_TOKENS) + passes * call
    return Term("quality", seconds, f"{tasks} task calls + {passes} comparison calls")


def _workload(
    cell: Cell,
    protocol: MeasureProtocol,
    model: ModelCost,
    rates: DeviceRates,
    strategy: CacheStrategy,
    start: list[Term],
    compile_s: float,
) -> CellForecast:
    workload = protocol.workload
    if workload is None:
        raise ValueError(f"workload cell {cell.label} but the protocol carries no workload")
    strategy = served_strategy(strategy, cell)  # a static layout reserves the mix's worst moment for every request
    mix = fitted(workload.mix_for(cell.model, cell.rate), model.shape.max_positions)  # its rate's arrivals
    replay = replay_seconds(mix, cell, strategy, model, rates)
    terms = [*start]
    if cell.compile:
        shapes = len(mix.input_lengths)
        terms.append(Term("compile", shapes * compile_s, f"{shapes} prompt lengths × {duration(compile_s)}"))
        terms.append(Term("cold replay", replay, f"{len(mix)} requests"))
    warm = workload.warmup_requests
    if warm and not cell.compile:
        warmup = replay_seconds(RequestMix(mix.name, mix.requests[:warm]), cell, strategy, model, rates)
        terms.append(Term("warmup", warmup, f"the first {warm} requests"))
    terms.append(Term("replay", replay, f"{len(mix)} requests, {cell.serving}"))
    one = call_cost(strategy, cell, model, rates, mix.longest_input, 2, 1)
    return CellForecast(Forecast(tuple(terms)), one.prefill_s, one.step_s)


def replay_seconds(mix: RequestMix, cell: Cell, strategy: CacheStrategy, model: ModelCost, rates: DeviceRates) -> float:
    """One replay of `mix`: each request alone (sequential), each static batch at its longest prompt and output
    (batched), or each run of B consecutive requests sharing its decode steps (continuous, its prefills apart);
    an open loop lasts at least until its last arrival."""
    requests = mix.requests
    seconds = 0.0
    if cell.serving == SEQUENTIAL:
        for r in requests:
            seconds += call_cost(strategy, cell, model, rates, r.input_tokens, r.output_tokens, 1).call(r.output_tokens)
    else:
        rows = cell.batch_size
        for start in range(0, len(requests), rows):
            group = requests[start : start + rows]
            longest, most = max(r.input_tokens for r in group), max(r.output_tokens for r in group)
            shared = call_cost(strategy, cell, model, rates, longest, most, len(group))
            if cell.serving == BATCHED:
                seconds += shared.call(most)
            else:  # continuous: no padding, each prompt's own prefill, then the shared steps
                prefills = sum(call_cost(strategy, cell, model, rates, r.input_tokens, 2, 1).prefill_s for r in group)
                seconds += prefills + (most - 1) * shared.step_s
    last = requests[-1].arrival_s
    return max(seconds, last) if last is not None else seconds


def _call_text(cost: CallCost, new: int) -> str:
    return f"prefill {duration(cost.prefill_s)} + {max(new - 1, 0)} × {duration(cost.step_s)}"


def _rate(rates: DeviceRates) -> str:
    return f"{rates.load_rate / 1e9:.2g} GB/s"
