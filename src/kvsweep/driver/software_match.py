"""Whether the nodes that run cells (and the driver) measure with the same code: the comparison alone.

Pure: it takes the reports (`node_software.describe_software`) and says, in one line each, which
software differs and where, and which GPU models the nodes have. Collecting the reports is
`software_survey.py`'s job; refusing or going on is the caller's.
"""

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvsweep.driver.node_software import DRIVER_SOFTWARE, GPU, SOFTWARE

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
    for field in fields:
        holders: dict[str, list[str]] = defaultdict(list)
        if field in DRIVER_SOFTWARE:
            holders[driver.get(field, "")].append(DRIVER)
        for node in nodes:
            if node.report is not None:
                holders[node.report.get(field, "")].append(node.name)
        if len(holders) > 1:
            found.append(f"{field} {by_value(holders)}")
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
