"""What a cell knows of its own process, each a small rule tested without Ray or a GPU.

- Whether an exception means "out of memory": the one place, for the cell's run and its quality check.
- Whether a process was killed for host memory: a forked cell that dies by SIGKILL is a host OOM when
  its cgroup's `oom_kill` counter rose while it ran (cgroup v2 `memory.events`, v1 `memory.oom_control`);
  None when no counter is readable.
- When this process started, to the clock tick: the start of every cell's timeline.
- How many intra-op threads torch gets in a cell.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path


def out_of_memory(exc: BaseException, device: str) -> str | None:
    """Which memory ran out ("device" or "host"), or None: the one place an exception is read as OOM.

    torch raises `OutOfMemoryError` for CUDA; other allocators (the CPU's, some CUDA paths inside
    extensions) raise a plain `RuntimeError` whose message is the only sign. Python's `MemoryError` is
    its own allocator's failure, always in host memory (a CPU cell's data-segment limit raises it too).
    """
    import torch  # here, not above: the driver plans with this module's thread rule and never loads torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "device"
    if isinstance(exc, MemoryError):
        return "host"
    message = str(exc).lower()
    if isinstance(exc, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message):
        return "device" if device == "cuda" else "host"
    return None


CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2
            count = _field(root / relative / "memory.events", "oom_kill")
        elif "memory" in controllers.split(","):
            count = _field(root / "memory" / relative / "memory.oom_control", "oom_kill")
        else:
            continue
        if count is not None:
            return count
    return None


def _field(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def process_started_at() -> float:
    """Wall-clock start of this process from /proc (psutil's create_time is only good to a second)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@dataclass(frozen=True)
class Threads:
    """torch's intra-op thread count for a cell, and which setting decided it (recorded with the result)."""

    count: int
    source: str  # measure.threads, ray.cpus_per_cell, OMP_NUM_THREADS or cpu affinity


def resolve_threads(
    device: str, requested: int, cpus_per_cell: int, omp_num_threads: str | None, allowed_cpus: int
) -> Threads:
    """How many threads a cell computes with; `measure.threads` > 0 is taken as it is.

    Otherwise (`measure.threads=0`, auto): a CPU cell uses every core its process may run on
    (`allowed_cpus`, its affinity): the CPU is what it measures, one cell at a time. A CUDA cell's CPU
    work is launching kernels, and the node's other GPUs have cells launching too: it uses the CPUs
    Ray reserved for it (`cpus_per_cell`, else the `OMP_NUM_THREADS` Ray sets from the actor's CPUs),
    never more than `allowed_cpus`; with neither (run outside Ray) every allowed core.
    """
    if requested > 0:
        return Threads(requested, "measure.threads")
    if device == "cuda":
        if cpus_per_cell > 0:
            return Threads(min(cpus_per_cell, allowed_cpus), "ray.cpus_per_cell")
        if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) > 0:
            return Threads(min(int(omp_num_threads), allowed_cpus), "OMP_NUM_THREADS")
    return Threads(allowed_cpus, "cpu affinity")
