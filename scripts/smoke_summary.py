"""Prints what a GPU smoke run proved, from its journal alone, in a form to paste into a bug report.

Per cell: status, the cache class `generate` really used (`kvsweep.cache_class`), the per-repeat
device peaks (flat when each call is one request), KV bytes (device and host for offloaded caches),
decode bandwidth utilization and the copy bandwidth it divides by, for compiled cells the graphs compiled
or recorded while measured and the graphs Inductor ran without CUDA graphs, and the CPUs and threads its
process had.
Exits 1 when any of these is found (each is one problem):
- the folder holds no result, or a cell that was not skipped failed (its process said why, or the
  driver recorded how it ended);
- a peak climbs by more than a tenth of its cache, or an offloaded cell held nothing in host memory;
- the cache's bytes on the device when `generate` returned differ from the planner's figure for that moment
  (`kv_cache_device_bytes` against `predicted_kv_device_bytes`; an offloaded cache: one moved layer there);
- a compiled cell skipped CUDA graphs, or (on CUDA) did not count them;
- on a GPU whose published peak is known (PEAK_GBPS), the copy bandwidth (`mem_bandwidth_gbps`) is
  above what its memory can do or so far below it that the reading is broken;
- on CUDA, a cell that ran was not given its own CPU slot, two cells that ran at once on one node
  shared a CPU, or a cell computed with more threads than its CPUs (or, threads following Ray's
  reservation, not exactly as many);
- a result made inside a cell was not measured in a process forked from a CUDA-clean template
  (`ray.fork_cells`): the template found CUDA initialised by a preload, or never started. Results the
  driver wrote itself (crashed, timed out, inferred OOM) never reached a cell's process: they are
  counted apart, as the failures they are;
- with --expect-cuda-init-error FOLDER: the sweep there, whose CUDA initialisation was made to fail,
  did not end as `error` results that the cell's own process sent on its first attempt, with the
  message the cell raises when CUDA cannot start (`CudaStartError: ...`).
- with --expect-weights FOLDER: the sweep there, one cell per weight quantization, has a cell that did not
  end ok, or one whose weights occupy other than the planner's exact figure (`weights_bytes` against
  `predicted_weights_bytes`: the byte formulas of bitsandbytes and torchao are checked only here);
- with --expect-workload FOLDER: the small workload sweep there (8 requests of two prompt lengths, one at
  a time and continuously batched) has a cell that should have run and did not end ok, did not time every
  request, or (paged) whose page pool differs from the planner's bytes;
- with --expect-split FOLDER: the sweep there, run with `ray.gpus_per_cell=2`, has no cell that ran
  with its model on one GPU: each must record its placement (`kvsweep.placement`, `placement` in its
  samples) and a peak for each of its GPUs in every repeat, the largest equal to its
  `peak_device_mem_bytes` (each GPU's measured peak is printed beside the planner's prediction); and
  both GPUs' UUIDs, a sharing probe of each, and (where the GPUs have energy counters) both GPUs' energy
  summed into `joules_per_token` (scripts/smoke_gpu_readings.py); and its memory limit on both GPUs
  (`kvsweep.memory_limit` names GPU 0 and GPU 1);
- on CUDA, what only a GPU shows (scripts/smoke_gpu_readings.py): a forked cell whose NVML could not start
  afresh, a `joules_per_token` missing for another reason than a GPU without the counter (a repeats'
  spread over 20% is said, not counted), a CPU slot not on the NUMA node its GPU hangs off.
Compiled cells planned skipped because Triton's launcher cannot be built here are counted.
Usage: python scripts/smoke_summary.py OUTPUT_FOLDER [--setup TEXT] [--expect-cuda-init-error FOLDER]
       [--expect-weights FOLDER] [--expect-split FOLDER] [--expect-workload FOLDER]
"""

import argparse
import re
import sys
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

from smoke_gpu_readings import gpu_line, numa_problems, split_energy_text, split_gpu_mismatch

from kvsweep.cell.cpu_slots import SLOT
from kvsweep.driver.sweep_forecast import forecast_summary
from kvsweep.grid import strategy_label
from kvsweep.names import Metric, ResultTag
from kvsweep.plan.triton_launcher import LAUNCHER_REASON_PREFIX
from kvsweep.results import ERROR, OK, SKIPPED, CellResult
from kvsweep.tracking.journal import Journal

WORKLOAD_REQUESTS = 8  # what scripts/gpu_smoke.sh's workload sweep asks for (workload.requests)

MIB = 1 << 20
# How kvsweep.cell.environment's error for a CUDA that cannot start begins (its class name, as
# kvsweep.cell.run_cell records every failure); imported by name, it would load torch and Transformers here.
CUDA_START_ERROR = "CudaStartError"
THREADS_FROM_RESERVATION = "ray.cpus_per_cell"  # kvsweep.cell.process: auto threads on CUDA follow Ray's CPUs
# Published peak memory bandwidth in GB/s, by a pattern of the device's name (the first match counts).
# `mem_bandwidth_gbps` counts a copy's bytes read plus written (STREAM's convention), as a peak does: a
# reading above PEAK_CEILING x peak is impossible, one below PEAK_FLOOR x peak a broken measurement. A MIG
# slice has a share of the bandwidth, so it is not compared.
PEAK_GBPS = (
    (r"\bH100 PCIe\b", 2000.0),
    (r"\bH100 NVL\b", 3900.0),
    (r"\bH100\b", 3350.0),  # SXM: "NVIDIA H100 80GB HBM3"
    (r"\bH200\b", 4800.0),
    (r"\bA100\b.*\b80GB\b", 2039.0),
    (r"\bA100\b.*\b40GB\b", 1555.0),
    (r"\bL40S\b", 864.0),
    (r"\bL4\b", 300.0),
    (r"\bA10G?\b", 600.0),
    (r"\bT4\b", 320.0),
)
PEAK_CEILING, PEAK_FLOOR = 1.1, 0.3


def made_in_cell(result: CellResult) -> bool:
    """The cell's actor sent this result (it stamps its node); the driver's own results carry no environment."""
    return "ray_node_id" in result.environment


def ran(result: CellResult) -> bool:
    return made_in_cell(result) and result.status != SKIPPED


def header(results: list[CellResult], setup: str) -> None:
    env = next((r.environment for r in results if r.environment.get("device_name")), {})
    print(
        f"kvsweep GPU smoke, {time.strftime('%Y-%m-%d')}: {env.get('device_name', '?')}, "
        f"CUDA {env.get('cuda_version')}, "
        f"torch {env.get('torch_version')}, transformers {env.get('transformers_version')}, "
        f"threads per cell {env.get('torch_threads')}"
    )
    if setup:
        print(f"setup: {setup}")


def cell_line(result: CellResult, on_cuda: bool) -> tuple[str, int]:
    """The cell's line and how many problems it shows."""
    cell, tags, metrics = result.cell, result.tags, result.metrics
    name = f"{cell.cache}{' compiled' if cell.compile else ''}"
    line, problems = f"{name:32s} {result.status:8s}", 0
    if result.status == OK:
        peaks = [s.get("peak_device_mem_bytes") or 0 for s in result.samples.get("repeats", [])]
        cache = metrics.get(Metric.KV_CACHE_BYTES, 0.0)
        climbing = len(peaks) > 1 and peaks[-1] - peaks[0] > max(0.1 * cache, MIB)
        problems += climbing
        line += (
            f" {tags.get(ResultTag.CACHE_CLASS, '?'):48s} peaks MiB {[round(p / MIB, 1) for p in peaks]}"
            f" kv {cache / MIB:.2f} MiB util {metrics.get(Metric.DECODE_BANDWIDTH_UTILIZATION, float('nan')):.2f}"
            f" implausible={tags.get(ResultTag.IMPLAUSIBLE)}{'  PEAKS CLIMB' if climbing else ''}"
        )
        text, wrong = bandwidth_reading(result, on_cuda)
        line, problems = line + text, problems + wrong
        text, wrong = kv_device_reading(result)
        line, problems = line + text, problems + wrong
        if cell.cache.startswith("offloaded"):  # where its bytes were: most of them on the host
            host = metrics.get(Metric.KV_CACHE_HOST_BYTES, 0.0)
            line += f" device {metrics.get(Metric.KV_CACHE_DEVICE_BYTES, 0) / MIB:.2f} MiB host {host / MIB:.2f} MiB"
            if host <= 0:
                problems += 1
                line += "  NOTHING OFFLOADED"
    else:
        problems += result.status != SKIPPED
        line += f" {result.error[:160]}"
    if cell.compile and result.status != SKIPPED:
        text, found = compile_counts(result, on_cuda)
        line += text
        problems += found and result.status == OK  # a cell that failed on it is already counted
    if on_cuda and result.status == OK and made_in_cell(result):  # NVML's readings: energy, NVML after fork
        text, found = gpu_line(result)
        line, problems = line + text, problems + found
    if made_in_cell(result):
        env = result.environment
        line += f" | cpus {env.get('cpus', '-')} ({env.get('cpus_from', '-')}) threads {env.get('torch_threads')}"
    elif result.status != SKIPPED:
        line += " | made by the driver"
    return line, problems


def kv_device_reading(result: CellResult) -> tuple[str, bool]:
    """The cache's bytes on the device when `generate` returned against the planner's figure for that moment
    (`predicted_kv_device_bytes`): equal for every strategy, an offloaded one's single prefetched layer included."""
    measured = result.metrics.get(Metric.KV_CACHE_DEVICE_BYTES)
    predicted = result.metrics.get(Metric.PREDICTED_KV_DEVICE_BYTES)
    if measured is None or predicted is None or measured == predicted:
        return "", False
    return f"  KV ON DEVICE {measured / MIB:.3f} MiB, PREDICTED {predicted / MIB:.3f} MiB", True


def published_peak_gbps(device_name: str) -> float | None:
    """The GPU's published peak memory bandwidth, or None: not in PEAK_GBPS, or a MIG slice of it."""
    if "MIG" in device_name:
        return None
    return next((peak for pattern, peak in PEAK_GBPS if re.search(pattern, device_name)), None)


def bandwidth_reading(result: CellResult, on_cuda: bool) -> tuple[str, bool]:
    """The cell's copy bandwidth, against its GPU's published peak when that is known."""
    gbps = result.metrics.get(Metric.MEM_BANDWIDTH_GBPS)
    if gbps is None:
        return " bw -", False
    text = f" bw {gbps:.0f} GB/s"
    peak = published_peak_gbps(str(result.environment.get("device_name", ""))) if on_cuda else None
    if peak is None:
        return text, False
    text += f" of {peak:.0f} peak"
    if gbps > PEAK_CEILING * peak:
        return text + "  BANDWIDTH ABOVE WHAT THE GPU CAN DO", True
    if gbps < PEAK_FLOOR * peak:
        return text + "  BANDWIDTH READING FAR BELOW THE GPU'S PEAK", True
    return text, False


def compile_counts(result: CellResult, on_cuda: bool) -> tuple[str, bool]:
    """A compiled cell's recaptures and CUDA-graph skips, and whether the skips show a problem."""
    recaptures = result.metrics.get(Metric.COMPILE_RECAPTURES, float("nan"))
    skips = result.metrics.get(Metric.COMPILE_CUDAGRAPH_SKIPS)
    text = f" recaptures {recaptures:.0f} cudagraph skips {'-' if skips is None else f'{skips:.0f}'}"
    if skips is not None and skips > 0:
        return text + "  CUDA GRAPHS SKIPPED", True
    if skips is None and on_cuda and result.status == OK:
        return text + "  CUDA-GRAPH SKIPS NOT COUNTED", True
    return text, False


def cpu_slot_problems(results: list[CellResult]) -> list[str]:
    """On CUDA each cell that ran owns its CPUs: given from its node's slots, shared with no cell running then."""
    running = [r for r in results if ran(r)]
    problems = [
        f"{_label(r)} ran on CPUs from {r.environment.get('cpus_from') or 'nothing'}, not a slot of its own"
        for r in running
        if r.environment.get("cpus_from") != SLOT
    ]
    for a, b in combinations(running, 2):
        shared = _cpus(a) & _cpus(b)
        if shared and _same_node(a, b) and _overlap(a, b):
            cpus = ",".join(map(str, sorted(shared)))
            problems.append(f"{_label(a)} and {_label(b)} ran at once on one node sharing CPUs {cpus}")
    return problems


def thread_problems(results: list[CellResult]) -> list[str]:
    """On CUDA a cell computes with no more threads than its CPUs, and with exactly as many when its
    threads follow the CPUs Ray reserved (the auto rule): more would contend with themselves."""
    problems = []
    for result in (r for r in results if ran(r)):
        threads, cpus = result.environment.get("torch_threads"), len(_cpus(result))
        if threads is None or not cpus:  # no CPUs recorded: cpu_slot_problems says so
            continue
        source = result.environment.get("threads_from")
        if threads > cpus or (source == THREADS_FROM_RESERVATION and threads != cpus):
            problems.append(f"{_label(result)} computed with {threads} threads ({source}) on {cpus} CPUs")
    return problems


def _label(result: CellResult) -> str:
    return f"{strategy_label(result.cell)} ctx{result.cell.context_length}"


def _cpus(result: CellResult) -> set[int]:
    return {int(cpu) for cpu in str(result.environment.get("cpus", "")).split(",") if cpu.strip()}


def _same_node(a: CellResult, b: CellResult) -> bool:
    return a.environment["ray_node_id"] == b.environment["ray_node_id"]


def _overlap(a: CellResult, b: CellResult) -> bool:
    start_a, end_a = a.environment.get("started_at", 0.0), a.environment.get("ended_at", 0.0)
    start_b, end_b = b.environment.get("started_at", 0.0), b.environment.get("ended_at", 0.0)
    return start_a < end_b and start_b < end_a


def dtype_prefill_problems(folder: Path) -> int:
    """The forecast's per-dtype peaks checked: each dtype's measured prefill (TTFT) against its forecast, printed
    (paste into BENCHMARKS.md); a problem only when a dtype's cell did not run or has no forecast."""
    results = {str(r.cell.dtype): r for r in Journal(folder).read().latest_results()}
    problems = 0
    for dtype in ("float32", "bfloat16"):
        result = results.get(dtype)
        ratio = result.metrics.get(Metric.FORECAST_RATIO_TTFT) if result is not None else None
        if result is None or result.status != OK or ratio is None:
            status = result.status if result is not None else "missing"
            print(f"DTYPE PREFILL: {dtype} cell {status}, no prefill against its forecast ({folder}/sweep.log)")
            problems += 1
            continue
        print(
            f"prefill {dtype}: ttft {result.metrics[Metric.TTFT_MS]:.1f} ms, {ratio:.2f}x its forecast "
            f"({'CUDA cores, TF32 off' if dtype == 'float32' else 'tensor cores'})"
        )
    return problems


def forecast_lines(results: list[CellResult]) -> list[str]:
    """Each cell's seconds against its forecast (the GPU figures' first check: paste these into BENCHMARKS.md),
    and the run's summary; information, never a problem."""
    lines = [
        f"forecast: {_label(r)} took {r.wall_s:.1f} s, forecast {r.metrics[Metric.FORECAST_S]:.1f} s: "
        f"{r.metrics[Metric.FORECAST_RATIO]:.2f}x"
        for r in results
        if Metric.FORECAST_RATIO in r.metrics
    ]
    summary = forecast_summary(results)
    return [*lines, summary] if summary else ["forecast: no cell has a forecast ratio"]


def toolchain_skips(results: list[CellResult]) -> int:
    """Compiled cells skipped because this node cannot build Triton's launcher (the planner's reason)."""
    return sum(r.cell.compile and r.status == SKIPPED and r.error.startswith(LAUNCHER_REASON_PREFIX) for r in results)


def forked_problems(results: list[CellResult]) -> int:
    """One problem when a cell's result did not come from a forked process, whatever else went wrong."""
    from_cells = [r for r in results if ran(r)]
    forked = [r for r in from_cells if r.environment.get("template")]
    by_driver = Counter(r.status for r in results if not made_in_cell(r) and r.status != SKIPPED)
    # A template refuses to fork once CUDA is initialised in it, so a forked cell proves a clean one.
    print(f"forked from a CUDA-clean template: {len(forked)} of {len(from_cells)} cells that ran")
    if by_driver:
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(by_driver.items()))
        print(f"made by the driver, no result from the cell's process (failures above): {statuses}")
    if len(forked) < len(from_cells):  # the template refused (CUDA initialised by a preload) or never started
        print("NOT FORKED: the sweep's output says why the template did not serve (ray.fork_cells=false skips this)")
        return 1
    return 0


def cuda_init_problems(folder: Path) -> int:
    """The sweep whose CUDA initialisation was made to fail: each cell an `error` its own process sent at
    once, with the cell's message for a CUDA that cannot start (not a device-side assert, not a crash
    the driver recorded and retried)."""
    results = Journal(folder).read().latest_results()
    if not results:
        print(f"CUDA that cannot start: NO RESULT in {folder} (its sweep.log says why)")
        return 1
    problems = 0
    for result in results:
        wrong = cuda_start_mismatch(result)
        problems += wrong is not None
        print(
            f"CUDA that cannot start: {_label(result)} {result.status} (attempt {result.attempt}): "
            f"{result.error[:160]} ({'as it should' if wrong is None else wrong})"
        )
    return problems


def cuda_start_mismatch(result: CellResult) -> str | None:
    """How a result of the cuda_init sweep differs from what a cell whose CUDA cannot start sends, or None."""
    if not made_in_cell(result):
        return "SHOULD COME FROM THE CELL'S PROCESS, NOT THE DRIVER"
    if result.status != ERROR or not result.error.startswith(CUDA_START_ERROR):
        return f"SHOULD BE error {CUDA_START_ERROR}: ..."
    if result.attempt != 1:
        return "SHOULD END ON ITS FIRST ATTEMPT, NOT BE RETRIED"
    return None


def weights_problems(folder: Path) -> int:
    """The sweep over every weight quantization: each cell ok, its stored weight bytes the planner's exactly."""
    results = Journal(folder).read().latest_results()
    if not results:
        print(f"quantized weights: NO RESULT in {folder} (its sweep.log says why)")
        return 1
    problems = 0
    for result in results:
        stored = result.metrics.get(Metric.WEIGHTS_BYTES)
        predicted = result.metrics.get(Metric.PREDICTED_WEIGHTS_BYTES)
        if result.status != OK:
            wrong = f"SHOULD BE ok: {result.error[:120]}"
        elif stored is None or stored != predicted:
            wrong = "STORED WEIGHT BYTES SHOULD EQUAL THE PLANNER'S"
        else:
            wrong = None
        problems += wrong is not None
        figures = f"{(stored or 0) / MIB:.2f} MiB stored, {(predicted or 0) / MIB:.2f} MiB predicted"
        print(f"quantized weights: {result.cell.weights} {result.status}: {figures} ({wrong or 'as it should'})")
    return problems


def workload_problems(folder: Path) -> int:
    """The small workload sweep: every cell that should run ran ok and timed every request of the mix, each
    request's first token no later than its last; the paged cells' pool is the planner's byte for byte."""
    results = Journal(folder).read().latest_results()
    if not results:
        print(f"workload: NO RESULT in {folder} (its sweep.log says why)")
        return 1
    problems = 0
    for result in results:
        if result.status == SKIPPED:
            print(f"workload: {_label(result)} skipped ({result.error[:100]})")
            continue
        requests = result.samples.get("requests") or []
        m = result.metrics
        if result.status != OK:
            wrong = f"SHOULD BE ok: {result.error[:120]}"
        elif len(requests) != WORKLOAD_REQUESTS or any(r["ttft_ms"] > r["e2e_ms"] for r in requests):
            wrong = f"SHOULD TIME ALL {WORKLOAD_REQUESTS} REQUESTS, EACH FIRST TOKEN BEFORE ITS LAST"
        elif result.cell.cache == "paged" and m.get(Metric.KV_CACHE_BYTES) != m.get(Metric.PREDICTED_KV_DEVICE_BYTES):
            wrong = "THE PAGE POOL SHOULD BE THE PLANNER'S BYTE FOR BYTE"
        else:
            wrong = None
        problems += wrong is not None
        figures = ", ".join(
            f"{name} {m[name]:.1f} ms"
            for name in (Metric.TTFT_MS_P90, Metric.TPOT_MS_P90, Metric.E2E_MS_P90)
            if name in m
        )
        print(f"workload: {_label(result)} {result.status}: {figures or '-'} ({wrong or 'as it should'})")
    return problems


def split_problems(folder: Path) -> int:
    """The sweep over two GPUs per cell: every cell that ran placed its model over both and measured both."""
    results = [r for r in Journal(folder).read().latest_results() if ran(r)]
    if not results:
        print(f"two GPUs per cell: NO CELL RAN in {folder} (its sweep.log says why)")
        return 1
    problems = 0
    for result in results:
        placement = result.samples.get("placement") or {}
        each = [call.get("peak_device_mem_bytes_per_gpu") or [] for call in result.samples.get("repeats", [])]
        wrong = split_mismatch(result, placement, each) or split_gpu_mismatch(result)
        readings, found = gpu_line(result) if result.status == OK else ("", 0)
        problems += (wrong is not None) + found
        predicted = " + ".join(f"{b / MIB:.0f}" for b in placement.get("predicted_peak_bytes", []))
        measured = " + ".join(f"{b / MIB:.0f}" for b in (each[-1] if each else []))
        print(
            f"two GPUs per cell: {_label(result)} {result.status} layers {result.tags.get(ResultTag.PLACEMENT)}; "
            f"peak MiB per GPU {measured or '-'} (predicted {predicted or '-'}){split_energy_text(result)}{readings} "
            f"({'as it should' if wrong is None else wrong})"
        )
    return problems


def split_mismatch(result: CellResult, placement: dict, each: list[list[int]]) -> str | None:
    """How a cell of the two-GPU sweep differs from one placed over both GPUs, or None."""
    if result.status != OK:
        return f"SHOULD BE ok: {result.error[:120]}"
    if len(placement.get("devices", [])) != 2 or not result.tags.get(ResultTag.PLACEMENT):
        return "SHOULD RECORD A PLACEMENT OVER 2 GPUS"
    if not each or any(len(peaks) != 2 or min(peaks) <= 0 for peaks in each):
        return "EVERY REPEAT SHOULD HAVE A PEAK ON EACH OF ITS 2 GPUS"
    largest = [max(peaks) for peaks in each]
    recorded = [call.get(Metric.PEAK_DEVICE_MEM_BYTES) for call in result.samples["repeats"]]
    if largest != recorded:
        return "peak_device_mem_bytes SHOULD BE THE LARGEST GPU'S"
    limit = str(result.tags.get(ResultTag.MEMORY_LIMIT, ""))
    if not all(f"GPU {index} " in limit for index in (0, 1)):
        return f"THE MEMORY LIMIT SHOULD CAP BOTH GPUS (kvsweep.memory_limit {limit or '-'})"
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--setup", default="", help="what the smoke script chose (torch build, index)")
    parser.add_argument("--expect-cuda-init-error", type=Path, help="a sweep run with the cuda_init fault")
    parser.add_argument("--expect-split", type=Path, help="a sweep run with ray.gpus_per_cell=2")
    parser.add_argument("--expect-weights", type=Path, help="a sweep with one cell per weight quantization")
    parser.add_argument("--expect-workload", type=Path, help=f"a workload sweep of {WORKLOAD_REQUESTS} requests")
    parser.add_argument("--expect-dtypes", type=Path, help="one dynamic cell in float32 and one in bfloat16")
    args = parser.parse_args(argv)
    journal = Journal(args.folder).read()
    results = journal.latest_results()
    on_cuda = journal.header is not None and journal.header.device == "cuda"
    header(results, args.setup)
    failures = 0 if results else 1
    if not results:
        print(f"NO RESULTS in {args.folder}: the sweep's output says why")
    for result in results:
        line, problems = cell_line(result, on_cuda)
        failures += problems
        print(line)
    running = [r for r in results if ran(r)]
    verdicts = sorted({str(r.tags.get(ResultTag.CONTENDED)) for r in running})
    sources = sorted({str(r.environment.get("threads_from")) for r in running})
    print(f"GPU sharing verdicts (NVML): {', '.join(verdicts)}; threads decided by: {', '.join(sources)}")
    if on_cuda:
        slot_problems = cpu_slot_problems(results)
        own = sum(r.environment.get("cpus_from") == SLOT for r in running)
        print(f"CPU slots: {own} of {len(running)} cells that ran were given CPUs of their own")
        for problem in slot_problems:
            print(f"CPU SLOT: {problem}")
        failures += len(slot_problems)
        threads = thread_problems(results)
        print(f"threads: {len(running) - len(threads)} of {len(running)} cells that ran fit their CPUs")
        for problem in threads:
            print(f"THREADS: {problem}")
        failures += len(threads)
        numa_line, numa = numa_problems(running)
        print(numa_line)
        for problem in numa:
            print(f"NUMA SLOT: {problem}")
        failures += len(numa)
    for line in forecast_lines(results):
        print(line)
    print(f"compiled cells skipped for the toolchain: {toolchain_skips(results)}")
    failures += forked_problems(results)
    if args.expect_cuda_init_error:
        failures += cuda_init_problems(args.expect_cuda_init_error)
    if args.expect_weights:
        failures += weights_problems(args.expect_weights)
    if args.expect_split:
        failures += split_problems(args.expect_split)
    if args.expect_workload:
        failures += workload_problems(args.expect_workload)
    if args.expect_dtypes:
        failures += dtype_prefill_problems(args.expect_dtypes)
    print(f"{'FAILED' if failures else 'OK'}: {failures} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
