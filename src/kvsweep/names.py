"""Every name kvsweep writes to MLflow: tags, params, metrics. One module, importable without MLflow.

The names are a contract (`docs/metrics.md` defines them): users' saved views and scripts use them.
The cell writes its tags and metrics with these constants, tracking logs and reads runs back with
them, and the report reads results with them, so nothing can drift. `tests/test_sweep.py` checks
that a real sweep logs exactly what is declared here.
"""

REPORT_DIR = "report"  # the run folder's report (plots, selection table, HTML), logged on the parent as is
CAPACITY_CSV = "capacity.csv"  # capacity frontiers, one row each: in the report folder and the run folder (parent run)
TASK_JSONL = "task.jsonl"  # a cell's task trials, one JSON object a line: what was asked, what the model said
RESULTS_JSON = "results.json"  # the sweep's params, every cell and the selection, for scripts: run folder, parent run
FORECAST_JSON = "forecast.json"  # the forecast: rates, what they rest on (a CPU's probes), each cell's terms
PARETO_CSV = "pareto.csv"  # each selection group's Pareto front (ranked latency, memory, quality), the pick marked
SATURATION_CSV = "saturation.csv"  # per cache, serving mode and mix: the highest offered rate sustained, and the next


def _values(namespace: type) -> tuple[str, ...]:
    return tuple(v for k, v in vars(namespace).items() if k.isupper() and isinstance(v, str))


class ResultTag:
    """Tags a cell's result carries (set in the cell or by the driver); they round-trip through MLflow."""

    INFERRED = "kvsweep.inferred"  # "true": recorded as OOM from a smaller cell's OOM, never run
    OOM_KIND = "kvsweep.oom_kind"  # device | host
    SHAPE_ONLY = "kvsweep.shape_only"  # "true": a bundled preset, random weights (numbers, not quality)
    CONTENDED = "kvsweep.contended"  # true | false | unknown
    CHECKPOINT_QUANTIZATION = "kvsweep.checkpoint_quantization"  # a checkpoint quantized already: awq-int4, fp8...
    PLACEMENT = "kvsweep.placement"  # a model over several GPUs: each one's decoder layers, "0-39 | 40-79"
    CONTENTION = "kvsweep.contention"  # what others took: "host 0.49, steal 0.00; gpu pids 1234"
    CI_TARGET = "kvsweep.ci_target"  # met | missed, only with measure.target_rel_ci
    IMPLAUSIBLE = "kvsweep.implausible"  # decode moved more bytes per second than the device can
    CACHE_CLASS = "kvsweep.cache_class"  # the cache object generate really used
    LOW_AGREEMENT = "kvsweep.low_agreement"
    QUALITY = "kvsweep.quality"  # why quality was not measured
    HOST_PEAK = "kvsweep.host_peak"  # how the host peak was taken
    QUALITY_LOSS = "kvsweep.quality_loss"  # true | false | undecided: task accuracy against dynamic's
    TASK = "kvsweep.task"  # informative | uninformative: <why> | none: whether the task can judge this group
    INPUTS_REASON = "kvsweep.inputs_reason"  # why the cell got these inputs (auto's choice, a failed tokenizer)
    TASKS_LEFT_OUT = "kvsweep.tasks_left_out"  # suite tasks too long for the cell's context: "cwe needs 813 tokens"
    SEARCH = "kvsweep.search"  # batch | context | batch+context: the capacity searches that asked for this probe
    FRONTIER = "kvsweep.frontier"  # max_batch | max_context | both, on the probe at a frontier (sweep end)
    FRONTIER_LIMIT = "kvsweep.frontier_limit"  # what stopped that frontier: memory, slo_tpot, search.max_batch ...
    ENERGY = "kvsweep.energy"  # why joules_per_token is missing: "unknown: <reason>"
    MEMORY_LIMIT = "kvsweep.memory_limit"  # how measure.device_memory_limit_gb was applied in the cell
    COMPILE_PAYBACK = "kvsweep.compile_payback"  # a compiled workload cell: "12 requests" | "never" | why not told
    PAGED_POOL = "kvsweep.paged_pool"  # a paged cell's pool and attention: "page_size=256 blocks=4 ... attention=sdpa"


class RunTag:
    """Bookkeeping tags the tracking client writes on parent and cell runs."""

    ROLE = "kvsweep.role"  # sweep | cell | compare
    SWEEP = "kvsweep.sweep"  # the sweep's name, on the parent and every cell run
    SWEEP_KEY = "kvsweep.sweep_key"
    RUN_DIR = "kvsweep.run_dir"
    COUNTS = "kvsweep.counts"
    CELL_ID = "kvsweep.cell_id"
    STATUS = "kvsweep.status"
    ATTEMPT = "kvsweep.attempt"
    DEVICE_NAME = "kvsweep.device_name"
    ERROR = "kvsweep.error"
    COMPARE_A = "kvsweep.compare_a"  # on a `compare --log` run: the parent run of sweep A...
    COMPARE_B = "kvsweep.compare_b"  # ...and of sweep B
    LEASE_OWNER = "kvsweep.lease_owner"  # on a parent while a sweep writes to it: "host=... pid=... token=..."
    LEASE_HEARTBEAT = "kvsweep.lease_heartbeat"  # the owner's renewal: its UTC time and a count, every beat
    PARENT_ID = "mlflow.parentRunId"
    RUN_NAME = "mlflow.runName"


VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # experiment tag holding a saved compare view, + its key
ENV_TAG_PREFIX = "kvsweep.env."  # the cell's environment record, one tag per field
SWEEP_ROLE, CELL_ROLE, COMPARE_ROLE = "sweep", "cell", "compare"
COMPARE_REGRESSIONS = "compare_regressions"  # metrics of a `compare --log` run: rows that are regressions...
COMPARE_MATCHED_CELLS = "compare_matched_cells"  # ...and cells both sweeps measured
COMPARE_METRICS = (COMPARE_REGRESSIONS, COMPARE_MATCHED_CELLS)
HUB_FETCH_S = "hub_fetch_s"  # the parent run's: seconds fetching Hub models on the nodes before any cell
SWEEP_METRICS = (HUB_FETCH_S,)  # the parent run's own metrics, beside its counts by status
CARRIED_TAGS = _values(ResultTag)


class Metric:
    """Per-cell metrics (a cell run's metrics; the report reads the same keys from results)."""

    TTFT_MS = "ttft_ms"
    TTFT_MS_P90 = "ttft_ms_p90"
    TPOT_MS = "tpot_ms"
    TPOT_MS_P90 = "tpot_ms_p90"
    E2E_MS = "e2e_ms"
    PREFILL_TOKENS_PER_S = "prefill_tokens_per_s"
    DECODE_TOKENS_PER_S = "decode_tokens_per_s"
    FIRST_CALL_MS = "first_call_ms"
    COMPILE_RECAPTURES = "compile_recaptures"  # graphs compiled or CUDA graphs recorded while measuring
    COMPILE_CUDAGRAPH_SKIPS = "compile_cudagraph_skips"  # Inductor ran a graph without CUDA graphs
    MODEL_LOAD_S = "model_load_s"
    WEIGHTS_BYTES = "weights_bytes"  # what the loaded model's weights occupy (quantized payloads and scales included)
    REPEATS = "repeats"
    DISCARDED_CALLS = "discarded_calls"
    HOST_OTHER_CPU_SHARE = "host_other_cpu_share"
    HOST_STEAL_SHARE = "host_steal_share"
    KV_CACHE_BYTES = "kv_cache_bytes"  # device + host
    KV_CACHE_DEVICE_BYTES = "kv_cache_device_bytes"
    KV_CACHE_HOST_BYTES = "kv_cache_host_bytes"  # offloaded layers in host memory
    KV_CACHE_BYTES_DENSE = "kv_cache_bytes_dense"
    KV_PAGES_PEAK = "kv_pages_peak"  # a paged cell: pages of its pool in use at the fullest moment of a call
    KV_CACHE_IN_USE_BYTES = "kv_cache_in_use_bytes"  # those pages' bytes (kv_cache_bytes is the whole pool)
    PEAK_DEVICE_MEM_BYTES = "peak_device_mem_bytes"
    PEAK_HOST_RSS_BYTES = "peak_host_rss_bytes"
    PREDICTED_PEAK_DEVICE_MEM_BYTES = "predicted_peak_device_mem_bytes"
    PREDICTED_WEIGHTS_BYTES = "predicted_weights_bytes"
    PREDICTED_KV_DEVICE_BYTES = "predicted_kv_device_bytes"
    PREDICTED_KV_HOST_BYTES = "predicted_kv_host_bytes"  # offloaded: pinned blocks, rounded up
    PREDICTED_TRANSFER_S_PER_TOKEN = "predicted_transfer_s_per_token"  # offloaded: host link round trip
    DECODE_BYTES_PER_TOKEN = "decode_bytes_per_token"  # read from device memory per decode step
    DECODE_HOST_LINK_BYTES_PER_TOKEN = "decode_host_link_bytes_per_token"  # offloaded: over the host link
    MEM_BANDWIDTH_GBPS = "mem_bandwidth_gbps"
    DECODE_BANDWIDTH_UTILIZATION = "decode_bandwidth_utilization"
    TOKEN_AGREEMENT = "token_agreement"
    FIRST_DIVERGENCE = "first_divergence"
    KL_DIVERGENCE = "kl_divergence"
    KL_DIVERGENCE_MAX = "kl_divergence_max"
    PASSKEY_ACCURACY = "passkey_accuracy"  # share of passkey prompts answered with their key
    ANSWER_ACCURACY = "answer_accuracy"  # share of a prompts file's answers matched exactly
    TASK_TRIALS = "task_trials"  # prompts answered behind the accuracy
    QUALITY_CHECK_S = "quality_check_s"  # seconds the cell spent on its quality checks (task, agreement, KL)
    CELL_WALL_S = "cell_wall_s"
    FORECAST_S = "forecast_s"  # the forecast of cell_wall_s, made before the cell ran (docs/forecast.md)
    FORECAST_RATIO = "forecast_ratio"  # cell_wall_s / forecast_s
    FORECAST_RATIO_LOAD = "forecast_ratio_load"  # model_load_s / the forecast's load term
    FORECAST_RATIO_TTFT = "forecast_ratio_ttft"  # ttft_ms / the forecast's prefill
    FORECAST_RATIO_TPOT = "forecast_ratio_tpot"  # tpot_ms / the forecast's decode step
    FORECAST_RATIO_QUALITY = "forecast_ratio_quality"  # quality_check_s / the forecast's quality term
    PREDICTED_MAX_BATCH = "predicted_max_batch"  # a batch search's probe: the planner's largest batch that fits
    PREDICTED_MAX_CONTEXT = "predicted_max_context"  # a context search's probe: the planner's longest context
    SEARCH_MAX_CONTEXT = "search_max_context"  # a context search's probe: the longest context it may probe
    JOULES_PER_TOKEN = "joules_per_token"  # device energy (NVML) over the measured calls / tokens they generated
    # A workload cell's per-request percentiles (over its requests; TTFT_MS_P90 and TPOT_MS_P90 above are the same
    # names: over requests in a workload cell, over repeats or decode gaps in a fixed-shape one)
    TTFT_MS_P50 = "ttft_ms_p50"
    TTFT_MS_P99 = "ttft_ms_p99"
    TPOT_MS_P50 = "tpot_ms_p50"
    TPOT_MS_P99 = "tpot_ms_p99"
    E2E_MS_P50 = "e2e_ms_p50"
    E2E_MS_P90 = "e2e_ms_p90"
    E2E_MS_P99 = "e2e_ms_p99"
    REQUESTS_PER_S = "requests_per_s"  # measured requests / the replay's span
    GOODPUT_REQUESTS_PER_S = "goodput_requests_per_s"  # those meeting every `slo.*` set, per second of the span
    OUTPUT_TOKENS_PER_S = "output_tokens_per_s"  # generated tokens / the replay's span
    STATIC_UNUSED_SHARE = "static_unused_share"  # a static cache over a mix: reserved token slots never filled
    PADDING_SHARE = "padding_share"  # batched serving: prompt positions that are padding
    RECOMPILES = "recompiles"  # a compiled cell over a mix: graphs compiled after the first request's
    COMPILE_S = "compile_s"  # a compiled cell over a mix: its cold replay's server seconds beyond the measured one's
    COMPILE_PAYBACK_REQUESTS = "compile_payback_requests"  # requests of the mix until compiling has paid back
    OFFERED_REQUESTS_PER_S = "offered_requests_per_s"  # the arrival rate a workload cell was offered (open loop)
    OVERGENERATION_SHARE = "overgeneration_share"  # batched: tokens generated past requests' own outputs, a share
    # A workload cell against the reference cell (its mix's dynamic cell, same serving mode, B and rate) on the same
    # requests: the median of the per-request ratios mine / reference (worked out by the report across cells)
    PAIRED_RATIO_TTFT = "paired_ratio_ttft"
    PAIRED_RATIO_TPOT = "paired_ratio_tpot"
    PAIRED_RATIO_E2E = "paired_ratio_e2e"


WORKLOAD_PERCENTILES = (
    (Metric.TTFT_MS_P50, Metric.TTFT_MS_P90, Metric.TTFT_MS_P99),
    (Metric.TPOT_MS_P50, Metric.TPOT_MS_P90, Metric.TPOT_MS_P99),
    (Metric.E2E_MS_P50, Metric.E2E_MS_P90, Metric.E2E_MS_P99),
)


TIMED = (Metric.TTFT_MS, Metric.TPOT_MS, Metric.E2E_MS)  # medians that carry a 95% interval
ACCURACIES = (Metric.PASSKEY_ACCURACY, Metric.ANSWER_ACCURACY)  # shares that carry an exact binomial interval
PASSKEY_DEPTH_PREFIX = "passkey_accuracy_depth_"


def ci_low(metric: str) -> str:
    return f"{metric}_ci_low"


def ci_high(metric: str) -> str:
    return f"{metric}_ci_high"


def with_interval(metric: str) -> tuple[str, str, str]:
    return metric, ci_low(metric), ci_high(metric)


PASSKEY_TASK = "passkey"  # the suite's single-key task, whose accuracy keeps its older name
TASK_PREFIX = "task_"
TASK_ACCURACY_SUFFIX = "_accuracy"


def task_accuracy_metric(task: str) -> str:
    """`task_niah_multikey_accuracy`: one suite task's share of trials answered in full (`passkey_accuracy`)."""
    return Metric.PASSKEY_ACCURACY if task == PASSKEY_TASK else f"{TASK_PREFIX}{task}{TASK_ACCURACY_SUFFIX}"


def task_trials_metric(task: str) -> str:
    """`task_vt_trials`: the trials behind one task's accuracy."""
    return f"{TASK_PREFIX}{task}_trials"


def task_partial_metric(task: str) -> str:
    """`task_vt_partial`: one task's mean share of expected values found (RULER's partial credit)."""
    return f"{TASK_PREFIX}{task}_partial"


def task_of_metric(metric: str) -> str | None:
    """The suite task an accuracy metric belongs to (`passkey` for `passkey_accuracy`), None for any other."""
    if metric == Metric.PASSKEY_ACCURACY:
        return PASSKEY_TASK
    if metric.startswith(TASK_PREFIX) and metric.endswith(TASK_ACCURACY_SUFFIX):
        return metric[len(TASK_PREFIX) : -len(TASK_ACCURACY_SUFFIX)] or None
    return None


def passkey_depth_metric(depth: float) -> str:
    """`passkey_accuracy_depth_50`: the accuracy of the needles hidden at this depth (in percent of the context)."""
    return f"{PASSKEY_DEPTH_PREFIX}{round(depth * 100)}"


INT_PARAMS = ("context_length", "batch_size", "max_new_tokens")  # also logged as metrics, to plot against
PARAM_KEYS = (
    "model",
    "dtype",
    "context_length",
    "batch_size",
    "max_new_tokens",
    "cache",
    "compile",
    "inputs",
    "weights",
    "workload",  # a workload cell's request mix (`workload.*`), with `serving`: "" on a fixed-shape cell
    "serving",
    "rate",  # a workload cell's offered Poisson rate, requests/s (`workload.rate`); 0: closed loop or a trace's times
)
INPUTS_SHA256_PARAM = "inputs_sha256"  # logged when the cell has measured (the cell hashes what it was fed)
# The cell's node as the driver surveyed it at connect (`driver/software_survey.py`): the hash of its software and
# its GPU model, params so that cells measured on two kinds of node group apart.
NODE_SOFTWARE_PARAM, GPU_MODEL_PARAM = "node_software", "gpu_model"
NODE_PARAMS = (NODE_SOFTWARE_PARAM, GPU_MODEL_PARAM)
CELL_PARAMS = (*PARAM_KEYS, "device", INPUTS_SHA256_PARAM, *NODE_PARAMS)
PAIRED_RATIOS = (Metric.PAIRED_RATIO_TTFT, Metric.PAIRED_RATIO_TPOT, Metric.PAIRED_RATIO_E2E)  # carry an interval
INTERVALS = (*TIMED, *ACCURACIES, *(name for row in WORKLOAD_PERCENTILES for name in row), *PAIRED_RATIOS)
CELL_METRICS = (*_values(Metric), *(f(m) for m in INTERVALS for f in (ci_low, ci_high)), *INT_PARAMS)
CELL_METRIC_PATTERNS = (
    f"{PASSKEY_DEPTH_PREFIX}<pct>",  # one metric per configured value: `<pct>` of 0-100
    *with_interval(task_accuracy_metric("<name>")),  # one set per task of the suite (`inputs.tasks`)
    task_trials_metric("<name>"),
    task_partial_metric("<name>"),
)


def is_cell_metric(name: str) -> bool:
    """A name a cell may log: one of `CELL_METRICS`, or a per-depth passkey accuracy."""
    depth = name.removeprefix(PASSKEY_DEPTH_PREFIX)
    return name in CELL_METRICS or (depth != name and depth.isdigit() and 0 <= int(depth) <= 100)


def sweep_count_metric(status: str) -> str:
    """The parent run's count of cells that ended with `status` (`cells_ok`, `cells_oom` ...)."""
    return f"cells_{status}"
