"""At connect, before any cell: every node that can run a cell reports its software, and a mismatch stops
the sweep (exit 2) unless `ray.allow_mixed_versions=true`; nodes with different GPU models are said.

One tiny Ray task per such node (no CPU asked, so a node whose CPUs are all taken still answers),
reading metadata only (`node_software.py`). A local instance this process started is asked in this
process instead: its one node is this machine, and Ray runs its workers with this interpreter and this
process's environment, so a task there would report exactly what this process does, only a worker
start later (0.3 s against 0.02 s on a 2-core machine; every sweep of the test suite connects).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsweep.driver.cell_resources import with_cpus_resolved
from kvsweep.driver.node_software import CPU_CELLS_SOFTWARE, GPU, SOFTWARE, describe_software, fingerprint
from kvsweep.driver.ray_session import CellNeeds, can_hold
from kvsweep.driver.software_match import NodeReport, gpu_line, gpu_models, mismatch_line, software_differences
from kvsweep.errors import ClusterError, first_line
from kvsweep.names import GPU_MODEL_PARAM, NODE_SOFTWARE_PARAM

SURVEY_TIMEOUT_S = 60.0  # a worker's start and a metadata read on a busy node; a node silent past it is named


@dataclass(frozen=True)
class Survey:
    """The driver's report and those of the nodes that can run a cell."""

    driver: dict[str, str]
    nodes: list[NodeReport] = field(default_factory=list)

    def cell_environment(self, node_id: str) -> dict[str, str]:
        """What a cell that ran on `node_id` records of its node: the software fingerprint and GPU model."""
        for node in self.nodes:
            if node.node_id == node_id and node.report is not None:
                return {NODE_SOFTWARE_PARAM: fingerprint(node.report), GPU_MODEL_PARAM: node.report[GPU]}
            if node.node_id == node_id:  # measured anyway (ray.allow_mixed_versions) on a node that did not answer
                return {NODE_SOFTWARE_PARAM: "unknown (no report at connect)", GPU_MODEL_PARAM: "unknown"}
        return {NODE_SOFTWARE_PARAM: "unchecked (the node joined after connect)", GPU_MODEL_PARAM: "unchecked"}


def check_software(needs: CellNeeds, local: bool, allow_mixed: bool, say: Callable[[str], None]) -> Survey:
    """The survey, after refusing a software mismatch (`ClusterError`, one line) unless `allow_mixed`,
    and saying a GPU-model difference. `local`: a local instance this process started (asked in-process).
    Cells on the CPU (no GPUs asked) compare no NVIDIA driver and say nothing of GPU models."""
    survey = take_survey(needs, local)
    fields = SOFTWARE if needs.gpus else CPU_CELLS_SOFTWARE
    differences = software_differences(survey.driver, survey.nodes, fields)
    if differences and not allow_mixed:
        raise ClusterError(mismatch_line(differences, allowed=False))
    if differences:
        say(mismatch_line(differences, allowed=True))
    if needs.gpus and (models := gpu_models(survey.nodes)):
        say(gpu_line(models))
    return survey


def take_survey(needs: CellNeeds, local: bool, timeout_s: float = SURVEY_TIMEOUT_S) -> Survey:
    """The driver's report and each cell-capable node's (in-process for a local instance, see above)."""
    import ray

    driver = describe_software()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    wanted = with_cpus_resolved(needs, [n["Resources"] for n in alive]).as_resources()
    nodes = [n for n in alive if can_hold(n["Resources"], wanted)]
    here = ray.get_runtime_context().get_node_id() if local else None
    in_process = [NodeReport(n["NodeID"], n["NodeManagerAddress"], driver) for n in nodes if n["NodeID"] == here]
    return Survey(driver, [*in_process, *ask_nodes([n for n in nodes if n["NodeID"] != here], timeout_s)])


def ask_nodes(nodes: Sequence[dict[str, Any]], timeout_s: float) -> list[NodeReport]:
    """One report task per node, pinned there; a task that fails or is not done in `timeout_s` is a problem."""
    if not nodes:
        return []
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(describe_software)
    refs = {
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(): n
        for n in nodes
    }
    done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    reports = []
    for ref in done:
        node = refs[ref]
        try:
            reports.append(NodeReport(node["NodeID"], node["NodeManagerAddress"], ray.get(ref)))
        except Exception as exc:  # the node cannot import kvsweep, its seam is malformed, it went away
            cause = getattr(exc, "cause", None) or exc  # a task's own error, without Ray's header line
            reports.append(NodeReport(node["NodeID"], node["NodeManagerAddress"], None, first_line(cause)))
    for ref in late:
        ray.cancel(ref, force=True)
        node = refs[ref]
        reports.append(NodeReport(node["NodeID"], node["NodeManagerAddress"], None, f"no answer in {timeout_s:g} s"))
    return sorted(reports, key=lambda r: (r.address, r.node_id))
