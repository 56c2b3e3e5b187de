"""How many intra-op threads torch gets in a cell: a pure rule, so it is tested without Ray or a GPU."""

from dataclasses import dataclass


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
