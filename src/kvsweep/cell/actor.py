"""The cell's side of Ray: an actor that lives for exactly one cell and holds its GPUs meanwhile.

The driver (`driver/scheduler.py`) creates one `CellActor` per cell (or a spare ahead of need) and kills it when
the cell is done. The measurement runs in a process forked from the node's warm template (`cell/template.py`),
which watches this actor and dies with it; with `ray.fork_cells=false` (or no template) it runs here. On a CPU host
a spare prepares under the host's gate held exclusively, and a measured phase holds it shared.

A forked CUDA cell runs on cores of its own, asked from the template (`cell/cpu_slots.py`); the result's
`environment.cpus`, `environment.cpus_from` and `environment.cpus_near_numa_node` say which, from where, and the
NUMA node its slot was asked to sit on (-1: none).
"""

import contextlib
import importlib
import os
import time
from typing import Any

import cloudpickle
import ray

from kvsweep.cell.cpu_slots import AFFINITY, CpuGrant, cores_to_ask, shared
from kvsweep.cell.gpu_numa import visible_gpus_node
from kvsweep.cell.process import NO_RESULT, GatedRun, gate_path, host_gate, oom_kills, process_started_at
from kvsweep.cell.request import CellRequest

RUNNER_MODULE = "kvsweep.cell.run_cell"
TEMPLATE_PREFIX = "kvsweep-template-"
# What the forked process takes from this actor: Ray's GPU assignment and thread count.
FORWARDED_ENV = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
NOT_FORKED = shared("measured in its actor's process (not forked), which no template pins")


class CellProcessDied(RuntimeError):
    """The cell's forked process ended without a result (a crash, a kill)."""

    def __init__(self, exitcode: int | None, host_oom: bool) -> None:
        how = f"signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
        how = how if exitcode is not None else "its template died"
        super().__init__(f"cell process died ({how})" + ("; the kernel killed it for host memory" if host_oom else ""))
        self.exitcode, self.host_oom = exitcode, host_oom

    def __reduce__(self) -> tuple[type, tuple[int | None, bool]]:  # crosses Ray back to the driver
        return CellProcessDied, (self.exitcode, self.host_oom)


def template_name(node_id: str) -> str:
    return f"{TEMPLATE_PREFIX}{node_id}"


class CellActor:
    """Lives for exactly one cell so that nothing (memory, compiled graphs, threads) leaks between cells.

    `prepare` names a module to import now (a spare: the cell comes later); `requested_at` is when the
    driver asked for the actor. Timestamps of every phase go into the result's `environment.timeline`.
    """

    def __init__(self, prepare: str = "", requested_at: float = 0.0, gated: bool = True) -> None:
        self.timeline: dict[str, float] = {"requested_at": requested_at}
        self.timeline["process_started_at"] = process_started_at()
        self.timeline["actor_init_at"] = time.time()
        self._gated = gated
        self.cpus = CpuGrant((), "")  # what the cell ran on: set when it runs
        if prepare:
            with host_gate(self._gate_path(), exclusive=True) if gated else contextlib.nullcontext():
                self.timeline["prepare_at"] = time.time()
                importlib.import_module(prepare)
            self.timeline["prepared_at"] = time.time()

    def ready(self) -> bool:
        return True

    def run(self, request: CellRequest, forked: bool = False) -> dict:
        started_at = time.time()
        self.timeline["run_at"] = started_at
        context = ray.get_runtime_context()
        # A node that joined after the driver's survey is checked here, before anything is measured on it.
        node_software = request.options.software.check_here(context.get_node_id(), ray.util.get_node_ip_address())
        result = self._forked(request) if forked else self._here(request)
        result["environment"].update(node_software)
        ended_at = time.time()
        self.timeline["returned_at"] = ended_at
        result["environment"].update(
            cpus=",".join(map(str, self.cpus.cpus)),
            cpus_from=self.cpus.source,
            cpus_near_numa_node=self.cpus.near,
            ray_node_id=context.get_node_id(),
            gpu_ids=",".join(str(g) for g in ray.get_gpu_ids()),
            started_at=started_at,
            ended_at=ended_at,
            timeline={k: round(v, 3) for k, v in self.timeline.items() if v},
        )
        return result

    def _here(self, request: CellRequest) -> dict:
        """Measure in this actor's own process, its measured phase under the host's gate."""
        self.cpus = CpuGrant(_affinity(), NOT_FORKED if request.protocol.device == "cuda" else AFFINITY)
        gate = GatedRun(self._gate_path() if self._gated else "", self.timeline)
        return gate.run(request)

    def _forked(self, request: CellRequest) -> dict:
        """Measure in a fresh process forked from this node's template; it dies with this actor."""
        try:
            template = ray.get_actor(template_name(ray.get_runtime_context().get_node_id()))
        except ValueError:  # this node's template is gone for good (restarts used up): measure here
            return self._here(request)
        envelope = {
            "request": request,
            "env": {k: os.environ.get(k) for k in FORWARDED_ENV},  # None: unset there too
            "owner_pid": os.getpid(),
            "gate_path": self._gate_path() if self._gated else "",
        }
        kills_before = oom_kills()
        try:
            self.cpus = self._take_cpus(template, request.protocol.device, request.options.cpus_per_cell)
            envelope["cpus"] = list(self.cpus.cpus)  # the forked process is pinned to them
            # By value: a strategy registered in the driver may live in a module the cell cannot import.
            reply = ray.get(template.measure.remote(cloudpickle.dumps(envelope), self.cpus.slot))
        except ray.exceptions.OutOfMemoryError:
            raise CellProcessDied(None, host_oom=True) from None
        except ray.exceptions.RayActorError as exc:  # the template died under this cell (Ray restarts it)
            raise CellProcessDied(None, host_oom="out_of_memory" in str(exc).lower()) from exc
        for stamp in ("forked_at", "received_at", "exited_at"):  # the template's view of the process
            self.timeline[f"process_{stamp}"] = reply[stamp]
        if reply["result"] is None:
            kills_after = oom_kills()
            host_oom = kills_before is not None and kills_after is not None and kills_after > kills_before
            raise CellProcessDied(reply["exitcode"], host_oom)
        result = reply["result"]
        if NO_RESULT in result:  # the forked process had no result to send (its request unreadable...): why
            raise RuntimeError(result[NO_RESULT])
        result["environment"]["template"] = reply["template"]
        self.timeline.update(result["environment"]["forked"].pop("timeline"))
        return result

    def _take_cpus(self, template: Any, device: str, cpus_per_cell: int) -> CpuGrant:
        """A CUDA cell's own cores from the node's template (as many as Ray reserved for this actor); with
        none (a CPU cell, or not enough free) the cell runs on this actor's affinity, as it always did."""
        reserved = ray.get_runtime_context().get_assigned_resources().get("CPU")
        wanted, source = cores_to_ask(device, reserved, cpus_per_cell)
        if not wanted:
            return CpuGrant(_affinity(), source)
        near = visible_gpus_node(os.environ.get("CUDA_VISIBLE_DEVICES"))  # the socket its GPUs hang off
        grant = ray.get(template.take_cpus.remote(wanted, os.getpid(), near))
        return grant if grant.cpus else CpuGrant(_affinity(), grant.source, near=near)

    def _gate_path(self) -> str:
        return gate_path(ray.get_runtime_context().get_session_name())


def _affinity() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))
