"""Planning a whole sweep before anything runs: model facts, each cell's plan, the dry run."""

from dataclasses import asdict, dataclass, replace

from kvsweep.config.schema import KvSweepConfig, MeasureConfig
from kvsweep.errors import ConfigError
from kvsweep.gpu_datasheet import gpu_by_key
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, MeasureProtocol, expand_grid
from kvsweep.inputs.spec import AUTO, TASKS, InputSpec
from kvsweep.models.facts import ModelFacts, read_facts
from kvsweep.models.gguf_source import gguf_weights_problem, is_gguf
from kvsweep.models.presets import preset_for_hub
from kvsweep.models.resolve import classify, hub_unreachable
from kvsweep.models.sharding import GpuLoad, layers_text
from kvsweep.names import Metric
from kvsweep.plan.cell_plan import PlannedCell, plan_cell
from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES, detect_device_bytes
from kvsweep.plan.offload import HostLimits, OffloadEstimate, host_limits
from kvsweep.plan.workload_cells import serving_problem, workload_cells
from kvsweep.plan.workload_prompts import with_prompt_lengths
from kvsweep.units import GB, MIB
from kvsweep.workload.workload_spec import WorkloadSpec, rate_axis, workload_from_config


def model_facts(
    models: list[str], trust_remote_code: bool, weights: list[str] | None = None
) -> tuple[dict[str, ModelFacts], dict[str, str]]:
    """Read each model's facts once (presets instantly). Unreadable ones get an error message. `weights`: the
    grid's weight quantizations; one asked for a checkpoint that is already quantized is a `ConfigError`."""
    facts: dict[str, ModelFacts] = {}
    problems: dict[str, str] = {}
    for model in models:
        try:
            facts[model] = read_facts(classify(model), trust_remote_code)
        except Exception as exc:  # a typo'd preset, a missing folder, an unreachable Hub
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            stand_in = preset_for_hub(model) if classify(model).kind == "hub" and hub_unreachable(first) else None
            if stand_in is not None:  # planned from the same shapes; the nodes fetch the checkpoint itself
                preset_facts = read_facts(classify(stand_in.name), trust_remote_code)
                facts[model] = replace(preset_facts, stand_in=stand_in.name)
                continue
            problems[model] = (
                f"model {model!r}: {first[:300]}"  # a GGUF file's reading says what is wrong with it
                if is_gguf(model)
                else f"model {model!r} could not be resolved: not a bundled preset, not a local folder, "
                f"and the Hub lookup failed ({first[:200]})"
            )
    for model, fact in facts.items():
        if problem := requantize_problem(model, fact, weights or []):
            raise ConfigError(problem)
    return facts, problems


def requantize_problem(model: str, facts: ModelFacts, weights: list[str]) -> str | None:
    """Why quantizing this model's weights is refused: its checkpoint is quantized already (a GGUF file too:
    Transformers loads it dequantized and refuses to quantize it again)."""
    asked = [w for w in weights if w != NO_WEIGHT_QUANTIZATION]
    if facts.gguf_type is not None and asked:
        return gguf_weights_problem(model, facts.gguf_type, asked[0])
    if facts.prequantized is None or not asked:
        return None
    return (
        f"grid.weights: {asked[0]} asked for {model}, whose checkpoint is already quantized "
        f"({facts.prequantized}); its weights load as they are: sweep it with grid.weights=[none]"
    )


@dataclass(frozen=True)
class PlanLimits:
    """What the plan fits a sweep's cells against, and where each figure came from (the plan text says both)."""

    device_bytes: int | None  # the smallest GPU a cell may land on; None: unknown, nothing skipped on a guess
    device_from: str
    host: HostLimits
    host_from: str
    gpus: int = 1  # GPUs each cell's model is split over (`ray.gpus_per_cell` on CUDA)


def cell_gpus(cfg: KvSweepConfig, device: str) -> int:
    """GPUs a cell places its model over: `ray.gpus_per_cell` on CUDA, none to split over elsewhere."""
    return cfg.ray.gpus_per_cell if device == "cuda" else 1


def plan_limits(cfg: KvSweepConfig, device: str, inputs: InputSpec | None = None) -> PlanLimits:
    """`inputs`: what text-fed cells answer (their task trials are calls the planner counts)."""
    planner = cfg.planner
    device_bytes = detect_device_bytes(device, planner.device_memory_gb)
    if device_bytes is None and device == "cuda" and planner.gpu:  # no local GPU: the named GPU's datasheet
        device_bytes = gpu_by_key(planner.gpu).memory_bytes
        planner_gpu = f"planner.gpu={planner.gpu}'s datasheet"
    else:
        planner_gpu = ""
    if planner.device_memory_gb > 0:
        device_from = "planner.device_memory_gb"
    elif planner_gpu:
        device_from = planner_gpu
    else:
        device_from = "the smallest local GPU" if device_bytes else "planner.device_memory_gb=0 and no local GPU"
    limit_gb = cfg.measure.device_memory_limit_gb
    if device == "cuda" and limit_gb > 0:  # torch's allocator is capped there; the CUDA context comes on top
        capped = int(limit_gb * GB) + CUDA_CONTEXT_BYTES
        if device_bytes is None or capped < device_bytes:
            device_bytes, device_from = capped, "measure.device_memory_limit_gb plus the CUDA context"
    protocol = protocol_of(cfg.measure, device, inputs or inputs_spec(cfg), cell_gpus(cfg, device), sweep_workload(cfg))
    host = host_limits(planner.host_memory_gb, planner.host_link_gbps, cfg.ray.cell_timeout_s, protocol)
    host_from = "planner.host_memory_gb" if planner.host_memory_gb > 0 else "this machine's"
    return PlanLimits(device_bytes, device_from, host, host_from, cell_gpus(cfg, device))


def plan_sweep(
    cfg: KvSweepConfig, device: str, limits: PlanLimits | None = None, inputs_by_model: dict[str, str] | None = None
) -> tuple[list[PlannedCell], dict[str, str]]:
    """`limits`: what `plan_limits` finds, when the caller prints them too (found once); `inputs_by_model`:
    what each model is fed (`driver/inputs_choice.py`; random ids where it says nothing)."""
    facts, problems = model_facts(cfg.grid.models, cfg.trust_remote_code, cfg.grid.weights)
    workload = sweep_workload(cfg)
    if workload is None:
        cells = expand_grid(asdict(cfg.grid), inputs_by_model)
    else:
        positions = {m: f.shape.max_positions if f.shape else None for m, f in facts.items()}
        rates = rate_axis(cfg.workload.rate)
        cells = workload_cells(asdict(cfg.grid), list(cfg.workload.serving), workload, positions, rates)
    limits = limits or plan_limits(cfg, device)
    planned = []
    for cell in cells:
        fact = facts.get(cell.model)
        planned.append(
            plan_cell(
                cell,
                device,
                fact.shape if fact else None,
                parameters=fact.planned_parameters if fact else None,
                device_bytes=limits.device_bytes,
                skip_predicted_oom=cfg.planner.skip_predicted_oom,
                host=limits.host,
                gpus=limits.gpus,
                layout=fact.layout if fact else None,
            )
        )
    return [serving_problem(p) for p in planned], problems


def limits_text(limits: PlanLimits) -> list[str]:
    """The sizes a CUDA plan fits cells against, each with its unit and where it came from."""
    device = "unknown" if limits.device_bytes is None else f"{limits.device_bytes / GB:.1f} GB"
    host = limits.host
    memory = "unknown" if host.memory_bytes is None else f"{host.memory_bytes / GB:.1f} GB"
    lines = [f"device memory {device} ({limits.device_from})"]
    if limits.device_bytes is None:
        lines[0] += ": no cell is planned as too large for its GPU"
    lines.append(
        f"offloaded caches: host memory {memory} ({limits.host_from}), host link {host.link_gbps:g} GB/s "
        f"(planner.host_link_gbps), cell timeout {host.timeout_s:g} s (ray.cell_timeout_s)"
    )
    return lines


def offload_note(estimate: OffloadEstimate) -> str:
    """What an offloaded cell that runs is predicted to take of the host: its pinned blocks and link time."""
    return (
        f"pinned host {estimate.host_bytes / GB:.1f} GB; host-link transfers alone {estimate.cell_seconds:.0f} s "
        f"over at most {estimate.calls.total} calls"
    )


def gpus_note(loads: tuple[GpuLoad, ...]) -> str:
    """A cell over several GPUs: each one's layers and predicted peak, as the cell will place it."""
    each = " + ".join(f"{load.peak_bytes / MIB:.0f}" for load in loads)
    return f"{len(loads)} GPUs, layers {layers_text(loads)}, peak per GPU {each} MiB"


def plan_text(
    planned: list[PlannedCell], problems: dict[str, str], device: str, limits: PlanLimits | None = None
) -> str:
    lines = [f"{len(planned)} cells on {device}; {sum(p.runs for p in planned)} to run"]
    if limits is not None and device == "cuda":
        lines += limits_text(limits)
    lines.append("")
    for p in planned:
        kv = "-" if p.kv_stored_bytes is None else f"{p.kv_stored_bytes / MIB:9.2f}"
        dense = "-" if p.kv_dense_bytes is None else f"{p.kv_dense_bytes / MIB:9.2f}"
        peak = "-" if p.memory is None else f"{p.memory.peak_bytes / MIB:10.1f}"
        what = problems.get(p.cell.model) or ("run" if p.runs else f"skip: {p.skip_reason}")
        if p.runs and p.offload is not None:
            what += f" ({offload_note(p.offload)})"
        if p.memory is not None and p.memory.per_gpu:
            what += f" ({gpus_note(p.memory.per_gpu)})"
        label = f"{p.cell.label} new{p.cell.max_new_tokens}"
        lines.append(f"{label:62s} kv {kv} MiB (dense {dense}) peak {peak} MiB  {what}")
    return "\n".join(lines)


def predicted_metrics(planned: PlannedCell) -> dict[str, float]:
    """Logged beside the measured peak so the planner's estimate can be checked."""
    metrics: dict[str, float] = {}
    if planned.memory is not None:
        m = planned.memory
        metrics[Metric.PREDICTED_PEAK_DEVICE_MEM_BYTES] = float(m.peak_bytes)
        metrics[Metric.PREDICTED_WEIGHTS_BYTES] = float(m.weights_bytes)
    if planned.kv_device_bytes is not None:  # when `generate` returns, as `kv_cache_device_bytes` is read
        metrics[Metric.PREDICTED_KV_DEVICE_BYTES] = float(planned.kv_device_bytes)
    if planned.offload is not None:
        metrics[Metric.PREDICTED_KV_HOST_BYTES] = float(planned.offload.host_bytes)
        metrics[Metric.PREDICTED_TRANSFER_S_PER_TOKEN] = planned.offload.seconds_per_token
    return metrics


def inputs_spec(cfg: KvSweepConfig) -> InputSpec:
    """The inputs settings without a prompts file (the file is read, once, by `driver/inputs_choice.py`)."""
    suite = tuple(cfg.inputs.tasks) if cfg.inputs.source in (AUTO, TASKS) else ()
    return InputSpec(tuple(cfg.inputs.depths), cfg.inputs.chat_template, cfg.measure.quality_trials, tasks=suite)


def protocol_of(
    m: MeasureConfig, device: str, inputs: InputSpec, gpus: int = 1, workload: WorkloadSpec | None = None
) -> MeasureProtocol:
    """The sweep's protocol: its `measure` config as it is, on `device`, fed `inputs`, over `gpus`, replaying
    `workload` in its workload cells."""
    return MeasureProtocol(m, device, inputs, gpus, workload)


def sweep_workload(cfg: KvSweepConfig) -> WorkloadSpec | None:
    """The sweep's request mix, drawn from `workload.*` with `measure.seed` (the same mix every time it is asked
    for; a trace or prompts file is read each time, already checked by the command), with a prompts file's
    lengths as each model's tokenizer encodes them."""
    workload = workload_from_config(cfg.workload, cfg.measure.seed, cfg.slo, cfg.inputs.chat_template)
    return None if workload is None else with_prompt_lengths(workload, list(cfg.grid.models), cfg.trust_remote_code)
