"""Which of a node's cores each CUDA cell runs on (disjoint sets, handed out by the node's template), and how many
torch threads a cell computes with (`resolve_threads`).

Ray reserves CPUs as a count and sets no affinity, so without slots every cell meters all of a node's cores and
reads each sibling GPU cell's kernel launching (about one core) as contention (docs/cluster.md). The node's
template (`cell/template.py`) owns one `CpuSlots`; a CUDA cell's actor asks it for the cores Ray reserved, and its
forked process is pinned to them and meters exactly them. A CPU cell takes no slot (one at a time, every core).

A slot goes back when its cell's process has ended, whatever happened. A slot whose owner is gone (an actor killed
between asking and forking) is taken back at the next request, unless its cell's process still runs: that one
outlives a killed actor by the time it takes to tear CUDA down, and its cores stay its own meanwhile. Plain
bookkeeping, tested without Ray; the cores' topology is read from /sys apart from it.

A slot sits on the NUMA node its cell's GPUs hang off when that node has room (`near`, from `cell/gpu_numa.py`);
otherwise: one NUMA node, idle physical cores, the lowest numbers.
"""

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

SLOT = "slot"  # the cell got cores of its own
AFFINITY = "affinity"  # a CPU cell: every core its actor may run on, as always
SYS_CPU = "/sys/devices/system/cpu"


def shared(why: str) -> str:
    """A CUDA cell that got no cores of its own runs on (and meters) its actor's affinity, shared: say why."""
    return f"shared: {why}"


class CpuPlace(NamedTuple):
    """Where a CPU sits; tuples order as slots prefer them: one NUMA node, then hyperthreads of one core."""

    node: int  # NUMA node
    core: tuple[int, int]  # (package, core id): the hyperthreads of one physical core share it
    cpu: int


@dataclass(frozen=True)
class CpuGrant:
    """What a cell runs on: its cores and where they came from (`SLOT`, `AFFINITY` or `shared(...)`).

    `slot` is the id to give back (0: nothing to give back); empty `cpus`: the actor's own affinity.
    """

    cpus: tuple[int, ...]
    source: str
    slot: int = 0
    near: int = -1  # the NUMA node it was asked to sit on (its GPUs'); -1: none


def cores_to_ask(device: str, reserved_cpus: float | None, cpus_per_cell: int) -> tuple[int, str]:
    """How many cores a cell asks its node's template for, or (0, where its CPUs come from instead).

    A CUDA cell asks for the whole CPUs Ray reserved for its actor (else the driver's `cpus_per_cell`);
    a fraction of a CPU is no core of its own. A CPU cell asks for none (see the module docstring).
    """
    if device != "cuda":
        return 0, AFFINITY
    cpus = reserved_cpus or cpus_per_cell
    if int(cpus) < 1:
        return 0, shared(f"Ray reserved {cpus:g} CPUs for the cell, less than one core")
    return int(cpus), ""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True


class CpuSlots:
    """Hands out disjoint sets of a node's cores, one per running CUDA cell; safe to use from threads.

    `alive(pid)` says whether a slot's owner still runs (the seam for tests; the default asks the kernel).
    """

    def __init__(self, places: Iterable[CpuPlace], alive: Callable[[int], bool] = pid_alive) -> None:
        self.places = sorted(places)
        self.alive = alive
        self._held: dict[int, tuple[int, frozenset[int]]] = {}  # slot -> (owner pid, its cpus)
        self._measuring: set[int] = set()  # slots whose cell's process runs now
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def take(self, wanted: int, owner_pid: int, near: int = -1) -> CpuGrant:
        """`wanted` cores no other slot holds, on NUMA node `near` when it has room (-1: any), or no slot
        (and why) when that many are not free."""
        with self._lock:
            for slot, (owner, _) in list(self._held.items()):
                if slot not in self._measuring and not self.alive(owner):
                    del self._held[slot]
            held = {cpu for _, cpus in self._held.values() for cpu in cpus}
            free = [p for p in self.places if p.cpu not in held]
            if wanted < 1 or wanted > len(free):
                why = f"{len(free)} of {len(self.places)} cores free, {wanted} wanted"
                return CpuGrant((), shared(why), near=near)
            chosen = _best_window(free, wanted, {p.core for p in self.places if p.cpu in held}, near)
            slot = next(self._ids)
            self._held[slot] = (owner_pid, frozenset(p.cpu for p in chosen))
            return CpuGrant(tuple(sorted(p.cpu for p in chosen)), SLOT, slot, near)

    @contextlib.contextmanager
    def in_measure(self, slot: int) -> Iterator[None]:
        """While the block runs, a process is running on `slot`'s cores: they stay lent even if the slot's
        owner dies meanwhile. The slot goes back when the block ends, however it ends."""
        with self._lock:
            self._measuring.add(slot)
        try:
            yield
        finally:
            self.release(slot)

    def release(self, slot: int) -> None:
        with self._lock:
            self._held.pop(slot, None)
            self._measuring.discard(slot)

    def held(self) -> dict[int, tuple[int, ...]]:
        """Each held slot's cpus (what the template is lending now)."""
        with self._lock:
            return {slot: tuple(sorted(cpus)) for slot, (_, cpus) in self._held.items()}


def _best_window(
    free: Sequence[CpuPlace], wanted: int, busy_cores: set[tuple[int, int]], near: int = -1
) -> Sequence[CpuPlace]:
    """Of the runs of `wanted` consecutive free places: all on node `near` (when known), then one NUMA node,
    then physical cores no other cell uses, then as few physical cores as possible (hyperthreads together),
    then the first."""

    def cost(start: int) -> tuple[bool, int, int, int, int]:
        window = free[start : start + wanted]
        cores, nodes = {p.core for p in window}, {p.node for p in window}
        return near >= 0 and nodes != {near}, len(nodes), len(cores & busy_cores), len(cores), start

    best = min(range(len(free) - wanted + 1), key=cost)
    return free[best : best + wanted]


def read_places(cpus: Iterable[int], root: str = SYS_CPU) -> list[CpuPlace]:
    """Where each CPU sits, from the kernel's topology files; a CPU whose files cannot be read counts as
    its own core on NUMA node 0 (slots are then plain runs of CPU ids)."""
    places = []
    for cpu in cpus:
        folder = Path(root) / f"cpu{cpu}"
        try:
            topology = folder / "topology"
            core = (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()))
        except (OSError, ValueError):
            core = (-1, cpu)
        nodes = sorted(int(n.name[4:]) for n in folder.glob("node*") if n.name[4:].isdigit())
        places.append(CpuPlace(nodes[0] if nodes else 0, core, cpu))
    return places


@dataclass(frozen=True)
class Threads:
    """torch's intra-op thread count for a cell, and which setting decided it (recorded with the result)."""

    count: int
    source: str  # measure.threads, ray.cpus_per_cell, OMP_NUM_THREADS or cpu affinity


def resolve_threads(
    device: str, requested: int, cpus_per_cell: int, omp_num_threads: str | None, allowed_cpus: int
) -> Threads:
    """How many threads a cell computes with; `measure.threads` > 0 is taken as it is.

    Auto (0): a CPU cell uses every core it may run on (`allowed_cpus`): the CPU is what it measures, one cell at
    a time. A CUDA cell's CPU work is launching kernels beside the node's other cells: it uses the CPUs Ray
    reserved (`cpus_per_cell`, else Ray's `OMP_NUM_THREADS`), at most `allowed_cpus`; outside Ray, every one.
    """
    if requested > 0:
        return Threads(requested, "measure.threads")
    if device == "cuda":
        if cpus_per_cell > 0:
            return Threads(min(cpus_per_cell, allowed_cpus), "ray.cpus_per_cell")
        if omp_num_threads and omp_num_threads.strip().isdigit() and int(omp_num_threads) > 0:
            return Threads(min(int(omp_num_threads), allowed_cpus), "OMP_NUM_THREADS")
    return Threads(allowed_cpus, "cpu affinity")
