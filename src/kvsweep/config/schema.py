"""The structured config schema: every key a user can set, with its type, default, help and bounds.

The one place a default lives: conf/measure/ presets state only how they differ, and the report, the validator
and the command line read defaults and choice lists (`RANK_BY`, `DEVICES`, `DEFAULT_EXPERIMENT`) from here.
Registered in Hydra's ConfigStore so composition rejects unknown keys and wrong types; `validate.py` checks every
`Bound` found here, plus what a single field cannot express (allowed names, one key against another).
"""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from kvsweep.config.measure_config import AT_LEAST_0, AT_LEAST_1, POSITIVE, SHARE, Bound, MeasureConfig, one_of, setting
from kvsweep.inputs.tasks.suite import DEFAULT_TASKS
from kvsweep.names import Metric
from kvsweep.units import DTYPE_BYTES

# What `report.rank_by` (and `--rank-by`) accept: a timing (a fixed shape's median, a workload's p90), or a timing's
# percentile over a workload's requests (a fixed shape ranks by the timing's median whatever the suffix)
RANK_BY = (Metric.TPOT_MS, Metric.TTFT_MS, Metric.E2E_MS)
RANK_BY_PERCENTILES = tuple(f"{timing}_p{q}" for timing in RANK_BY for q in (50, 90, 99))
OBJECTIVES = ("latency", "memory", "throughput", "goodput")  # what `report.objective` accepts
DEVICES = ("auto", "cuda", "cpu")  # what `device` accepts
DEFAULT_EXPERIMENT = "kvsweep"  # `mlflow.experiment`, and the `report` and `compare` commands' `--experiment`


@dataclass
class GridConfig:
    models: list[str] = setting(lambda: ["tiny-llama"], "model references: preset name, local path or Hub id")
    weights: list[str] = setting(
        lambda: ["none"],
        "weight quantization applied when a model is loaded: none, quanto-int8, quanto-int4 (CPU and CUDA), "
        "bnb-nf4, bnb-int8 (CUDA), torchao-int4 (CUDA)",
    )
    dtypes: list[str] = setting(lambda: ["float32"], ", ".join(DTYPE_BYTES))
    context_lengths: list[int] = setting(lambda: [256], "prompt lengths in tokens", AT_LEAST_1)
    batch_sizes: list[int] = setting(lambda: [1], "batch sizes", AT_LEAST_1)
    max_new_tokens: list[int] = setting(
        lambda: [32], "generated tokens per request (exactly; EOS disabled)", AT_LEAST_1
    )
    caches: list[str] = setting(
        lambda: ["dynamic"],
        "cache strategies; static@N / offloaded_static@N reserve N tokens (at least the request's); "
        "quantized-*@r256,g32,ak1,av1 set the residual length, group size and key/value axes (quote the name)",
    )
    compile: list[bool] = setting(lambda: [False], "compile the forward (static strategies only)")


@dataclass
class InputsConfig:
    source: str = setting(
        "auto",
        "auto (the task suite for a model with a tokenizer, else random), tasks, random, passkey (the single-key "
        "task alone) or file (inputs.path)",
    )
    tasks: list[str] = setting(
        lambda: list(DEFAULT_TASKS),
        "the task suite a text-fed cell runs, each measure.quality_trials times: passkey, niah_single, "
        "niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe (RULER's synthetic tasks)",
    )
    path: str = setting("", "prompts for source=file: .jsonl (one {prompt | messages, answer?} a line) or .txt")
    depths: list[float] = setting(
        lambda: [0.1, 0.5, 0.9], "where passkey needles sit, as a share of the context", Bound(0, 1, meaning="0-1")
    )
    chat_template: bool = setting(True, "wrap each prompt in the tokenizer's chat template when it has one")


@dataclass
class RayConfig:
    address: str = setting(
        "",
        "empty: RAY_ADDRESS if set, else a local instance; 'auto', 'host:port' or 'ray://host:port': join a "
        "cluster; 'local': a local instance whatever RAY_ADDRESS says",
    )
    gpus_per_cell: int = setting(
        1,
        "whole GPUs per cell on CUDA; above 1 the model's layers are split over them as the planner predicts",
        AT_LEAST_1,
    )
    cpus_per_cell: int = setting(
        0,
        "CPUs Ray reserves per cell; 0 = auto: 1 on CPU, on CUDA (node CPUs - 1) x gpus_per_cell // node GPUs, 1-8",
        AT_LEAST_0,
    )
    max_concurrent: int = setting(0, "cells at a time; 0 = one per GPU (CUDA) or one (CPU)", AT_LEAST_0)
    cell_timeout_s: float = setting(1800.0, "kill a cell's actor after this many seconds", POSITIVE)
    max_retries: int = setting(1, "retries of a crashed or timed-out cell, each in a fresh actor", AT_LEAST_0)
    prestart: int = setting(1, "spare cell actors started ahead of need (CPU cells only); 0 = off", AT_LEAST_0)
    fork_cells: bool = setting(
        True, "measure each cell in a fresh process forked from a warm per-node template (false: import per cell)"
    )
    accelerator_type: str = setting("", "only GPUs of this kind (Ray accelerator type, e.g. H100, A100)")
    resources: dict[str, float] = setting(dict, "custom Ray resources each cell needs, e.g. {nvme: 1}", AT_LEAST_0)
    allow_mixed_versions: bool = setting(
        False,
        "measure even when the nodes that run cells (or the driver) report different software (torch, CUDA, "
        "Transformers, quantization backends, kvsweep's sources, Python, NVIDIA driver); false: exit 2 first",
    )


@dataclass
class MlflowConfig:
    tracking_uri: str = setting("", "empty: MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db")
    experiment: str = setting(
        DEFAULT_EXPERIMENT, "MLflow experiment for the sweep's runs; this default gives way to MLFLOW_EXPERIMENT_NAME"
    )


@dataclass
class PlannerConfig:
    device_memory_gb: float = setting(
        0.0, "size of the smallest GPU cells may land on, in GB (1e9 bytes); 0 = the local GPU's, if any", AT_LEAST_0
    )
    skip_predicted_oom: bool = setting(True, "plan cells predicted not to fit that GPU as skipped")
    host_memory_gb: float = setting(
        0.0,
        "host memory of a GPU node in GB (1e9 bytes), for offloaded caches' pinned blocks; 0 = this machine's",
        AT_LEAST_0,
    )
    host_link_gbps: float = setting(
        25.0, "host-device copy speed offloaded caches get, GB/s (PCIe 4.0 x16: ~25)", POSITIVE
    )
    gpu: str = setting(
        "",
        "the GPU the time forecast assumes (h100-sxm, a100-80gb, l4, ...: docs/forecast.md); empty = the local "
        "GPU's, detected from its name",
    )
    gpus: int = setting(
        0,
        "GPUs the forecast's bill counts where no cluster with GPUs is connected (a dry run elsewhere); 0 = 1",
        AT_LEAST_0,
    )
    max_gpu_hours: float = setting(
        0.0,
        "refuse a sweep forecast to take more GPU-hours (on a CPU: hours) before any cell starts; 0 = no budget",
        AT_LEAST_0,
    )


@dataclass
class ReportConfig:
    rank_by: str = setting(
        Metric.TPOT_MS,
        f"what 'fastest' means in the selection table: {one_of(RANK_BY)} (a workload: its p90 over requests), or a "
        "workload percentile such as tpot_ms_p99 (the highest one its requests can give an interval is ranked)",
    )
    objective: str = setting(
        "latency",
        f"what the pick optimises within the constraints (quality, max_slowdown, SLOs): {one_of(OBJECTIVES)}",
    )
    max_slowdown: float = setting(
        0.10,
        "no pick is slower than dynamic by more than this on any latency (TTFT, TPOT, e2e) not waived; the leanest "
        "pick may be this much slower than the fastest (0.10 = 10%)",
        AT_LEAST_0,
    )
    waive_slowdown: list[str] = setting(
        list, f"latencies max_slowdown does not hold a pick to (e.g. [ttft_ms]): {one_of(RANK_BY)}"
    )
    min_token_agreement: float = setting(
        0.9, "flag caches whose tokens agree with dynamic less than this (0-1; reported, never decides alone)", SHARE
    )
    max_accuracy_drop: float = setting(
        0.05, "refuse caches whose task accuracy is below dynamic's by more than this (intervals apart)", SHARE
    )
    max_kl: float = setting(
        0.5,
        "where no informative task judges a group (random ids, a task dynamic fails), refuse caches whose mean "
        "teacher-forced KL from dynamic exceeds this many nats (0.5: calibrated on SmolLM2-135M, docs/report.md)",
        POSITIVE,
    )
    gpu_hour_cost: float = setting(
        0.0,
        "price of one GPU-hour: turns capacity goodput into cost per 1M output tokens; 0 = no cost line",
        AT_LEAST_0,
    )


@dataclass
class SearchConfig:
    batch: bool = setting(
        False, "find each cache's largest batch that fits and meets the SLO, per context (replaces grid.batch_sizes)"
    )
    contexts: bool = setting(
        False,
        "find each cache's largest context that fits and meets the SLO, per batch (replaces grid.context_lengths)",
    )
    max_batch: int = setting(256, "the batch search's ceiling: a frontier that reaches it ends there", AT_LEAST_1)
    max_context: int = setting(
        0, "the context search's ceiling; 0 = the model's positions less max_new_tokens", AT_LEAST_0
    )
    context_step: int = setting(
        1024, "the context search's resolution: every probed context is a multiple of this", AT_LEAST_1
    )


@dataclass
class SloConfig:
    tpot_ms: float = setting(
        0.0,
        "a search probe meets the SLO when its tpot_ms 95% interval's upper end is at most this; 0 = none",
        AT_LEAST_0,
    )
    ttft_ms: float = setting(
        0.0,
        "a search probe meets the SLO when its ttft_ms 95% interval's upper end is at most this; 0 = none",
        AT_LEAST_0,
    )


@dataclass
class WorkloadConfig:
    source: str = setting(
        "",
        "empty: the grid's fixed shapes; lengths (input_lengths/output_lengths drawn with measure.seed), file "
        "(path: your prompts, answers scored; output_lengths) or trace (path): a mix of requests replayed through "
        "every cache instead of grid.context_lengths/max_new_tokens",
    )
    name: str = setting("", "the mix's name in params, plots and the selection (default: the source)")
    input_lengths: str = setting(
        "", "prompt lengths for source=lengths: fixed:128,512 | uniform:64-512 | lognormal:median=256,p99=2048"
    )
    output_lengths: str = setting("", "generated tokens per request for source=lengths or file (same forms)")
    path: str = setting(
        "",
        "source=trace: JSONL, one {input_tokens, output_tokens[, arrival_s]} a line; source=file: prompts as "
        "inputs.path takes them (.jsonl of prompt|messages[, answer], or .txt)",
    )
    requests: int = setting(32, "requests in the mix (a trace's or prompts file's first N)", AT_LEAST_1)
    serving: list[str] = setting(
        lambda: ["sequential"],
        "sequential (one at a time), batched (static batches of B, padded), continuous (B in flight: paged only); "
        "B from grid.batch_sizes",
    )
    rate: list[float] = setting(
        list,
        "Poisson arrival rates in requests per second, an axis (one cell per rate, e.g. [0.5,1,2]): open loop, "
        "every cache at one rate given the same arrival times; empty or 0 = closed loop or the trace's own times",
        AT_LEAST_0,
    )
    warmup_requests: int = setting(
        2, "the mix's first requests replayed once, uncounted, before the measured replay", AT_LEAST_0
    )


@dataclass
class KvSweepConfig:
    name: str = setting("quickstart", "sweep name")
    grid: GridConfig = field(default_factory=GridConfig)
    inputs: InputsConfig = field(default_factory=InputsConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    device: str = setting("auto", one_of(DEVICES))
    trust_remote_code: bool = setting(False, "allow Hub models' own code (off unless you turn it on)")
    dry_run: bool = setting(False, "print the grid and plan, start nothing")
    rerun: bool = setting(False, "start a fresh sweep instead of resuming the last one with this config")
    infer_oom: bool = setting(True, "record larger cells of an OOM'd model/dtype/cache as oom without running them")
    search: SearchConfig = field(default_factory=SearchConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)


def register_schema() -> None:
    """Make `kvsweep_schema` available as the base of the primary config."""
    ConfigStore.instance().store(name="kvsweep_schema", node=KvSweepConfig)
