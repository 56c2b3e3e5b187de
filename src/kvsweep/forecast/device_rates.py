"""What a forecast divides by: the rates of the device the cells will run on, sustained, and where they come from.

A GPU's are its datasheet peaks (`gpu_datasheet.py`, chosen by `planner.gpu` or detected from the local GPU's name)
times the shares in `sustained.py`: uncalibrated until a GPU run has measured them, and said so. A CPU's are
measured here, in-process, as the cells will see them: a linear layer's FLOP/s in each dtype of the grid and the
copy bandwidth the cells probe too (`measure.bandwidth`), at shares calibrated on this CPU (`CPU_*`, BENCHMARKS.md).
"""

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from kvsweep.errors import ConfigError
from kvsweep.forecast import sustained
from kvsweep.gpu_datasheet import FLOAT32, GPUS, TERA, Gpu, detect, gpu_by_key
from kvsweep.units import GB

# A CPU cell's rates against what the probes read, and its fixed costs: calibrated by
# `scripts/benchmarks/forecast_accuracy.py` on this project's 2-core CPU (BENCHMARKS.md, "Forecast").
# The shares are against the probes as a sweep takes them: in the driver, while the node's template imports torch
# beside it, so they read low (float32 90 GFLOP/s there against ~175 on a quiet core pair) and a share tops 1.
CPU_FLOP_FRACTION = 1.76  # a prefill's matmuls and attention, against the probe's linear layer in the cell's dtype
CPU_BANDWIDTH_FRACTION = 0.74  # a decode step's bytes, against the probe's copy (which counts read + write)
CPU_LAYER_OVERHEAD_S = 8.4e-4  # host time a decoder layer adds to each forward (Python, module calls, small ops)
# A compiled decode step's, a layer: tiny-llama's (4 layers, the shape host time dominates) saved 0.20 ms a layer
# compiled (BENCHMARKS.md, "Forecast"); SmolLM2's saved 0.51, Inductor's fusions sparing bytes too, which the
# forecast does not count: a compiled step is forecast no faster than that.
CPU_COMPILED_LAYER_OVERHEAD_S = 6.4e-4  # eager's less those 0.20 ms
CPU_START_S = 0.75  # an actor from the warm template to its first call: device set-up, the bandwidth probe
CPU_LOAD_BYTES_PER_S = 0.28e9  # building the model from its files (a preset: initialising random weights)
CPU_COMPILE_ALLOWANCE_S = 60.0  # torch.compile of a cell's forward (each new shape: again), until one was measured

GPU_START_S = 15.0  # actor start, CUDA context, imports beyond the warm template: a guess until a GPU run
GPU_COMPILE_ALLOWANCE_S = 90.0  # Inductor + CUDA graphs capture of a decode step: a guess until a GPU run

PROBE_SIDE = 1024  # the FLOP probe's matrices: beyond the caches, small enough to run in a few milliseconds
PROBE_SECONDS = 0.3


@dataclass(frozen=True)
class DeviceRates:
    """Sustained rates of one device, the fixed costs of a cell on it, and what they rest on."""

    name: str  # "NVIDIA H100 SXM5 80GB (datasheet)", "this CPU (measured)"
    flop_rate: float  # FLOP/s a prefill sustains
    bandwidth: float  # device-memory bytes/s a decode step sustains
    host_link: float  # bytes/s one way between host and device (offloaded caches)
    load_rate: float  # model bytes/s from its files to the device
    layer_overhead_s: float  # host seconds a decoder layer adds to every forward pass
    start_s: float  # a cell's start: its process, device set-up and probes, before the model loads
    compile_allowance_s: float  # torch.compile of one shape, until a compiled cell of the model was measured
    calibrated: bool  # False: datasheet shares no run has checked (a GPU until its first run)
    gpu: Gpu | None = None
    dtype_flop_rates: Mapping[str, float] = field(default_factory=dict)  # dtype -> its own rate, where not flop_rate
    probes: "CpuProbes | None" = None  # a CPU's: what its rates were computed from
    compiled_layer_overhead_s: float | None = None  # a compiled cell's decode step, a layer (None: as eager)

    def step_layer_overhead_s(self, compiled: bool) -> float:
        """Host seconds a decoder layer adds to a decode step: less where the step is compiled."""
        if compiled and self.compiled_layer_overhead_s is not None:
            return self.compiled_layer_overhead_s
        return self.layer_overhead_s

    def flop_rate_of(self, dtype: str) -> float:
        """FLOP/s a prefill of `dtype` sustains: a GPU's per-dtype peak (float32 on the CUDA cores, TF32 off); a
        CPU's probe in that dtype, at the calibrated share."""
        return self.dtype_flop_rates.get(dtype, self.flop_rate)

    def to_dict(self) -> dict[str, object]:
        """Plain data (`forecast.json`): the rates, the GPU by its key, a CPU's probe readings."""
        plain = {k: v for k, v in asdict(self).items() if k not in ("gpu", "probes")}
        gpu, probes = self.gpu, self.probes
        return {**plain, "gpu": gpu and gpu.key, "probes": probes and probes.to_dict()}

    def label(self) -> str:
        text = f"{self.name}, {'calibrated' if self.calibrated else 'uncalibrated (datasheet shares)'}"
        if self.gpu is not None:
            gpu = self.gpu
            text += (
                f"; peaks bf16/fp16 {gpu.bf16_flops / TERA:g} TFLOP/s (tensor cores), float32 "
                f"{gpu.fp32_flops / TERA:g} (CUDA cores: TF32 off)"
            )
        return text


def gpu_rates(gpu: Gpu, host_link_gbps: float) -> DeviceRates:
    """A GPU's datasheet peaks at the sustained shares; the host link as configured (`planner.host_link_gbps`,
    a sustained rate), never above what the part's PCIe link sustains (its datasheet rate at `HOST_LINK_FRACTION`:
    25.6 GB/s for a Gen4 x16 part, 51.2 for Gen5)."""
    return DeviceRates(
        name=f"{gpu.name} (datasheet)",
        flop_rate=gpu.bf16_flops * sustained.GPU_FLOP_FRACTION,
        dtype_flop_rates={d: gpu.flops(d) * sustained.GPU_FLOP_FRACTION for d in (FLOAT32, "float16", "bfloat16")},
        bandwidth=gpu.memory_bandwidth * sustained.GPU_BANDWIDTH_FRACTION,
        host_link=min(host_link_gbps * GB, gpu.host_link * sustained.HOST_LINK_FRACTION),
        load_rate=sustained.LOAD_BYTES_PER_S,
        layer_overhead_s=sustained.LAYER_OVERHEAD_S,
        compiled_layer_overhead_s=sustained.COMPILED_LAYER_OVERHEAD_S,
        start_s=GPU_START_S,
        compile_allowance_s=GPU_COMPILE_ALLOWANCE_S,
        calibrated=False,
        gpu=gpu,
    )


def choose_gpu(key: str, local_names: list[str]) -> Gpu:
    """`planner.gpu` when set, else the local GPU detected from its driver name; a one-line `ConfigError` when
    neither says which GPU (a CUDA sweep planned from a machine without one, or a GPU not in the table)."""
    if key:
        return gpu_by_key(key)
    for name in local_names:
        if (found := detect(name)) is not None:
            return found
    known = ", ".join(g.key for g in GPUS)
    seen = f"the local GPU is {local_names[0]!r}, not in the table" if local_names else "no local GPU"
    raise ConfigError(f"planner.gpu is not set and {seen}: name the GPU the forecast assumes ({known})")


@dataclass(frozen=True)
class CpuProbes:
    """What this CPU's probes read as the sweep starts: a linear layer's FLOP/s in each dtype the grid runs (a CPU
    without bfloat16 instructions runs a bfloat16 matmul several times slower than a float32 one) and the copy
    bandwidth. Kept with the forecast (`forecast.json`) so a check can forecast the same cells again later."""

    flop_rates: Mapping[str, float]  # dtype -> FLOP/s
    bandwidth: float  # bytes/s, as `measure.bandwidth` reads it

    def to_dict(self) -> dict[str, object]:
        return {"flop_rates": dict(self.flop_rates), "bandwidth": self.bandwidth}


def probe_cpu(threads: int = 0, dtypes: Iterable[str] = (FLOAT32,)) -> CpuProbes:
    """The probes, now (about half a second a dtype), float32 always: the rate the others are named against."""
    from kvsweep.measure.bandwidth import device_bandwidth

    rates = {dtype: probe_flop_rate(threads, dtype) for dtype in dict.fromkeys((FLOAT32, *dtypes))}
    return CpuProbes(rates, device_bandwidth("cpu").gbps * GB)


def cpu_rates(probes: CpuProbes) -> DeviceRates:
    """This CPU's rates from its probes' readings, at the calibrated shares."""
    flops = probes.flop_rates[FLOAT32]
    each = ", ".join(f"{dtype} {rate / 1e9:.0f}" for dtype, rate in probes.flop_rates.items())
    return DeviceRates(
        name=f"this CPU (measured: {each} GFLOP/s, {probes.bandwidth / GB:.1f} GB/s)",
        flop_rate=flops * CPU_FLOP_FRACTION,
        dtype_flop_rates={d: r * CPU_FLOP_FRACTION for d, r in probes.flop_rates.items()},
        bandwidth=probes.bandwidth * CPU_BANDWIDTH_FRACTION,
        host_link=probes.bandwidth * CPU_BANDWIDTH_FRACTION,  # an "offload" on a CPU copies within host memory
        load_rate=CPU_LOAD_BYTES_PER_S,
        layer_overhead_s=CPU_LAYER_OVERHEAD_S,
        compiled_layer_overhead_s=CPU_COMPILED_LAYER_OVERHEAD_S,
        start_s=CPU_START_S,
        compile_allowance_s=CPU_COMPILE_ALLOWANCE_S,
        calibrated=True,
        probes=probes,
    )


def probe_flop_rate(threads: int = 0, dtype: str = FLOAT32) -> float:
    """FLOP/s of a linear layer (`F.linear`, the call a model's layers make) in `dtype`, square, best of repeated
    readings over `PROBE_SECONDS` (`threads` > 0: with that many threads, as `measure.threads` runs a cell; else
    torch's default, every core, as a CPU cell runs)."""
    import torch
    import torch.nn.functional as F

    before = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        kind = getattr(torch, dtype)
        a = torch.randn(PROBE_SIDE, PROBE_SIDE, dtype=kind)
        b = torch.randn(PROBE_SIDE, PROBE_SIDE, dtype=kind)
        F.linear(a, b)  # first touch: page faults and thread start are not compute
        best, until = float("inf"), time.perf_counter() + PROBE_SECONDS
        while time.perf_counter() < until:
            started = time.perf_counter()
            F.linear(a, b)
            best = min(best, time.perf_counter() - started)
        return 2 * PROBE_SIDE**3 / best
    finally:
        torch.set_num_threads(before)
