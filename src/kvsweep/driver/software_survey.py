"""Whether the nodes that run cells (and the driver) measure with the same code, asked at connect.

Every node that can run a cell reports its software (`node_software.py`, metadata only) in one tiny Ray task that
asks no CPU, so a node whose CPUs are all taken still answers; a mismatch stops the sweep (exit 2) unless
`ray.allow_mixed_versions=true`, and differing GPU models are said. A node that joins later (autoscaling) is
checked by its first cell, against what the surveyed nodes agree on, before it measures (`SoftwareCheck`).
A local instance this process started is asked in this process instead: Ray runs its workers with this
interpreter and environment, so a task there would report the same, a worker start later (0.3 s against 0.02 s
on 2 cores; every test sweep connects).
"""

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvsweep.driver.actor_placement import with_cpus_resolved
from kvsweep.driver.ray_session import CellNeeds, can_hold
from kvsweep.errors import ClusterError, first_line
from kvsweep.names import GPU_MODEL_PARAM, NODE_SOFTWARE_PARAM
from kvsweep.node_software import (
    CPU_CELLS_SOFTWARE,
    DRIVER_SOFTWARE,
    GPU,
    NO_GPU,
    SOFTWARE,
    SoftwareCheck,
    describe_software,
    fingerprint,
)

NAMED_PER_VALUE = 3  # nodes named beside one value; more are counted
DRIVER = "the driver"
MIXED_VERSIONS_KEY = "ray.allow_mixed_versions"
ONE_ENVIRONMENT_DOC = "docs/cluster.md#one-environment-on-every-node"


@dataclass(frozen=True)
class NodeReport:
    """One node's answer: its report, or why there is none (it failed, or did not answer in time)."""

    node_id: str
    address: str
    report: Mapping[str, str] | None
    problem: str = ""

    @property
    def name(self) -> str:
        """`10.0.0.7 (node 3f2a1b0c)`: the address a user knows, and the id prefix cells record."""
        return f"{self.address} (node {self.node_id[:8]})"


def software_differences(
    driver: Mapping[str, str], nodes: Sequence[NodeReport], fields: Sequence[str] = SOFTWARE
) -> list[str]:
    """`transformers 5.25.0 on the driver, 10.0.0.7 (node 3f2a1b0c); 9.9.9 on 10.0.0.8 (node 77aa01be)`,
    one entry per field of `fields` that differs (in that order), then one per node without a report.
    The driver counts for `DRIVER_SOFTWARE` only."""
    found = []
    for key in fields:
        holders: dict[str, list[str]] = defaultdict(list)
        if key in DRIVER_SOFTWARE:
            holders[driver.get(key, "")].append(DRIVER)
        for node in nodes:
            if node.report is not None:
                holders[node.report.get(key, "")].append(node.name)
        if len(holders) > 1:
            found.append(f"{key} {by_value(holders)}")
    found += [f"{node.name} gave no report ({node.problem})" for node in nodes if node.report is None]
    return found


def gpu_models(nodes: Sequence[NodeReport]) -> str:
    """`NVIDIA H100 80GB HBM3 on ...; NVIDIA A100-SXM4-80GB on ...` when the nodes' GPUs differ, else ""."""
    holders: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        if node.report is not None:
            holders[node.report.get(GPU, "")].append(node.name)
    return by_value(holders) if len(holders) > 1 else ""


def by_value(holders: Mapping[str, list[str]]) -> str:
    """Each value with who has it, the most widely held first: a lone odd node reads last."""
    ranked = sorted(holders.items(), key=lambda item: (-len(item[1]), item[0]))
    return "; ".join(f"{value or '?'} on {named(who)}" for value, who in ranked)


def named(who: list[str]) -> str:
    if len(who) <= NAMED_PER_VALUE:
        return ", ".join(who)
    return f"{', '.join(who[:NAMED_PER_VALUE])} and {len(who) - NAMED_PER_VALUE} more nodes"


def mismatch_line(differences: list[str], allowed: bool) -> str:
    """The one line a software mismatch is told in: refused, or measured anyway when allowed."""
    what = " | ".join(differences)
    if allowed:
        return f"nodes run different software, measuring anyway ({MIXED_VERSIONS_KEY}=true): {what}"
    return (
        f"nodes run different software, so their cells would not measure the same code: {what}; "
        f"give every node one environment ({ONE_ENVIRONMENT_DOC}) or set {MIXED_VERSIONS_KEY}=true"
    )


def gpu_line(models: str) -> str:
    return (
        f"nodes have different GPUs: {models}; each cell records its node's (param gpu_model): compare cells "
        "of one GPU model, or set ray.accelerator_type to measure on one kind"
    )


SURVEY_TIMEOUT_S = 60.0  # a worker's start and a metadata read on a busy node; a node silent past it is named


@dataclass(frozen=True)
class Survey:
    """The driver's report and those of the nodes that can run a cell; `check`: what a cell on a node not among
    them (one that joined later) compares its node with before measuring."""

    driver: dict[str, str]
    nodes: list[NodeReport] = field(default_factory=list)
    check: SoftwareCheck = field(default_factory=SoftwareCheck)

    def gpu_names(self) -> list[str]:
        """The GPU models the nodes reported (what the forecast detects its GPU from when the driver has none)."""
        names = []
        for node in self.nodes:
            value = node.report.get(GPU, "") if node.report is not None else ""
            names += [n for n in value.split(", ") if n and n != NO_GPU and not n.startswith("unknown")]
        return list(dict.fromkeys(names))

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
    return replace(survey, check=later_nodes_check(survey, fields, allowed=bool(differences)))


def later_nodes_check(survey: Survey, fields: Sequence[str], allowed: bool) -> SoftwareCheck:
    """What a node that joins after connect must report to run cells: each compared field's value on the surveyed
    nodes (the driver's, for its own fields, where no node answered). Nothing to match where mixed versions were
    measured anyway: such a node's cells only record its software."""
    surveyed = frozenset(node.node_id for node in survey.nodes)
    reports = [node.report for node in survey.nodes if node.report is not None]
    if allowed:
        return SoftwareCheck(surveyed, {}, enabled=True)
    if reports:
        reference = {key: reports[0].get(key, "") for key in fields}
    else:
        reference = {key: survey.driver.get(key, "") for key in fields if key in DRIVER_SOFTWARE}
    return SoftwareCheck(surveyed, reference, enabled=True)


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
