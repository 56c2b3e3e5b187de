"""Prints what a GPU smoke run proved, from its journal alone, in a form to paste into a bug report.

Per cell: status, the cache class `generate` really used (`kvsweep.cache_class`), the per-repeat
device peaks (flat when each call is one request), KV bytes (device and host for offloaded caches),
decode bandwidth utilization, and for compiled cells the graphs compiled or recorded while measured
(a compiled cell with any fails on its own, so it shows as `error`).
Exits 1 when a cell that was not skipped failed, a peak climbs by more than a tenth of its cache, or an
offloaded cell held nothing in host memory.
Also counts the cells measured in a process forked from a CUDA-clean template (`ray.fork_cells`):
one that was not is a failure (the template found CUDA initialised by a preload, or never started).
Usage: python scripts/smoke_summary.py OUTPUT_FOLDER
"""

import sys
import time
from pathlib import Path

from kvsweep.results import OK, SKIPPED
from kvsweep.tracking.journal import Journal

MIB = 1 << 20


def main(folder: str) -> int:
    journal = Journal(Path(folder)).read()
    failures = 0
    results = journal.latest_results()
    env = next((r.environment for r in results if r.environment.get("device_name")), {})
    print(
        f"kvsweep GPU smoke, {time.strftime('%Y-%m-%d')}: {env.get('device_name', '?')}, "
        f"CUDA {env.get('cuda_version')}, "
        f"torch {env.get('torch_version')}, transformers {env.get('transformers_version')}, "
        f"threads per cell {env.get('torch_threads')}"
    )
    for result in results:
        cell, tags, metrics = result.cell, result.tags, result.metrics
        name = f"{cell.cache}{' compiled' if cell.compile else ''}"
        line = f"{name:32s} {result.status:8s}"
        if result.status == OK:
            peaks = [s.get("peak_device_mem_bytes") or 0 for s in result.samples.get("repeats", [])]
            cache = metrics.get("kv_cache_bytes", 0.0)
            climbing = len(peaks) > 1 and peaks[-1] - peaks[0] > max(0.1 * cache, MIB)
            failures += climbing
            line += (
                f" {tags.get('kvsweep.cache_class', '?'):48s} peaks MiB {[round(p / MIB, 1) for p in peaks]}"
                f" kv {cache / MIB:.2f} MiB util {metrics.get('decode_bandwidth_utilization', float('nan')):.2f}"
                f" implausible={tags.get('kvsweep.implausible')}{'  PEAKS CLIMB' if climbing else ''}"
            )
            if cell.cache.startswith("offloaded"):  # where its bytes were: most of them on the host
                host = metrics.get("kv_cache_host_bytes", 0.0)
                line += f" device {metrics.get('kv_cache_device_bytes', 0) / MIB:.2f} MiB host {host / MIB:.2f} MiB"
                if host <= 0:
                    failures += 1
                    line += "  NOTHING OFFLOADED"
            if cell.compile:
                line += f" recaptures {metrics.get('compile_recaptures', float('nan')):.0f}"
        else:
            failures += result.status != SKIPPED
            line += f" {result.error[:160]}"
        print(line)
    ran = [r for r in results if r.status != SKIPPED]
    verdicts = sorted({str(r.tags.get("kvsweep.contended")) for r in ran})
    sources = sorted({str(r.environment.get("threads_from")) for r in ran})
    print(f"GPU sharing verdicts (NVML): {', '.join(verdicts)}; threads decided by: {', '.join(sources)}")
    forked = [r for r in ran if r.environment.get("template")]
    # A template refuses to fork once CUDA is initialised in it, so a forked cell proves a clean one.
    print(f"forked from a CUDA-clean template: {len(forked)} of {len(ran)} cells that ran")
    if len(forked) < len(ran):  # the template refused (CUDA initialised by a preload) or never started
        failures += 1
        print("NOT FORKED: the sweep's output says why the template did not serve (ray.fork_cells=false skips this)")
    print(f"{'FAILED' if failures else 'OK'}: {failures} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
