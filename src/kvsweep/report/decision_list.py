"""Which decisions the short form and the decision table list.

A capacity search's probes are ordinary cells, and each batch or context one strategy's search probed
is a group of its own: a "fastest" chosen among one strategy says nothing and buries the lines that
do. In a sweep with search probes, groups with a single strategy are left out of the decision lists
(never out of the evidence table), and one line says how many and why.
"""

from dataclasses import dataclass

from kvsweep.names import ResultTag
from kvsweep.report.selection import Decision
from kvsweep.results import CellResult


@dataclass(frozen=True)
class Listing:
    listed: list[Decision]
    left_out: int = 0

    def note(self) -> str:
        if not self.left_out:
            return ""
        groups = "group" if self.left_out == 1 else "groups"
        return (
            f"{self.left_out} single-strategy {groups} left out of the decision list: capacity probes, where each "
            "batch/context one strategy's search probed is a model/dtype/batch/context group with nothing to "
            "choose between (its cells are in the evidence table, its frontier in the capacity section)"
        )


def list_decisions(decisions: list[Decision], results: list[CellResult]) -> Listing:
    """Every decision; in a sweep with search probes (`kvsweep.search`), those with more than one strategy."""
    if not any(r.tags.get(ResultTag.SEARCH) for r in results):
        return Listing(decisions)
    listed = [d for d in decisions if len(d.entries) > 1]
    return Listing(listed, len(decisions) - len(listed))
