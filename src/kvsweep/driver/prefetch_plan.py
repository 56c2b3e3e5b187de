"""The plan's side of the Hub prefetch: which models the pending cells need, and the plan once fetched.

The planner reads each model on the driver before anything is fetched. The prefetch then decides what the
cells can do: a model no node could fetch has its cells skipped with the reason, and one the driver could
not read but the nodes fetched is planned again from its fetched files.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from kvsweep.driver.hub_prefetch import ModelFetch
from kvsweep.grid import Cell
from kvsweep.model_names import is_path
from kvsweep.models.facts import ModelFacts
from kvsweep.models.gguf_source import hub_gguf
from kvsweep.models.resolve import classify
from kvsweep.plan.cell_plan import PlannedCell


def hub_models(models: Iterable[str]) -> list[str]:
    """The references that are Hub ids (not a bundled preset, not a folder on this machine), in order."""
    return list(dict.fromkeys(m for m in models if classify(m).kind == "hub"))


def models_to_fetch(pending: list[PlannedCell], problems: Mapping[str, str]) -> list[str]:
    """The Hub models of the cells still to run. One the planner could not read is fetched only when it is
    named as a Hub repo (`org/name`, or a GGUF file in one: `org/name/file.gguf`): a bare name that is no preset
    and no folder stays the planner's error, as it is most likely a mistyped preset."""
    return hub_models(
        p.cell.model
        for p in pending
        if (p.runs and p.cell.model not in problems)
        or (p.cell.model in problems and (is_repo_id(p.cell.model) or hub_gguf(p.cell.model) is not None))
    )


def is_repo_id(reference: str) -> bool:
    """`org/name`, as every Hub repo is named today (a bare `gpt2` is an old alias the Hub still answers)."""
    return reference.count("/") == 1 and not is_path(reference) and all(reference.split("/"))


def skip_unavailable(planned: list[PlannedCell], fetches: Mapping[str, ModelFetch]) -> list[PlannedCell]:
    """The plan with every cell of a model that could not be fetched skipped with the reason (a cell
    already skipped for another reason keeps its own)."""
    return [
        replace(p, skip_reason=fetch.problem)
        if p.runs and (fetch := fetches.get(p.cell.model)) is not None and fetch.problem is not None
        else p
        for p in planned
    ]


def plan_after(
    pending: list[PlannedCell],
    problems: Mapping[str, str],
    fetches: Mapping[str, ModelFetch],
    replan: Callable[[Cell, ModelFacts], PlannedCell] | None = None,
) -> tuple[list[PlannedCell], dict[str, str]]:
    """The pending cells and the models' problems once the fetches are known: a model that could not be
    fetched has its cells skipped with the reason (no longer an error of the plan); one the planner could not
    read on the driver but the nodes fetched is planned again from its fetched files (`replan`; None where
    the plan cannot be made again, a capacity search's, and it stays an error)."""
    readable = {
        m: fetch.facts for m, fetch in fetches.items() if replan and m in problems and not fetch.problem and fetch.facts
    }
    cells = [
        replan(p.cell, facts) if replan and (facts := readable.get(p.cell.model)) else p
        for p in skip_unavailable(pending, fetches)
    ]
    kept = {m: why for m, why in problems.items() if m not in readable and not (m in fetches and fetches[m].problem)}
    return cells, kept
