"""Fetch the Hugging Face Hub models the pending cells need, once per node, before any cell starts.

A Hub model fetched inside its first cell would spend that cell's timeout on the download (a 16 GB checkpoint can
take all of it), and cells starting together on a node would race for the same files. So each node fetches every
Hub model in a short Ray task, as `native_builds` builds extensions (what a node runs: `hub_node_fetch.py`), and
the cells load from the cached snapshot. This is the driver's side: which models the pending cells need, the
fetches spread over the nodes and their outcomes combined, and the plan once they are known (`plan_after`).
"""

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import ray

from kvsweep.driver.hub_node_fetch import REASON_CHARS, HfHubSource, HubSettings, HubSource, NodeFetch, fetch_on_node
from kvsweep.errors import first_line
from kvsweep.grid import Cell
from kvsweep.model_names import is_path
from kvsweep.models.facts import ModelFacts
from kvsweep.models.gguf_source import hub_gguf
from kvsweep.models.resolve import classify
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.units import GB

if TYPE_CHECKING:
    from kvsweep.config.schema import KvSweepConfig
    from kvsweep.driver.job_sources import JobSource
    from kvsweep.driver.sweep_tracking import Tracking
    from kvsweep.plan.sweep_plan import PlanLimits

FETCH_TIMEOUT_S = 4 * 3600.0  # a 16 GB checkpoint over a slow link; each cell keeps its own timeout
PROGRESS_EVERY_S = 30.0
MB = 10**6


@dataclass(frozen=True)
class ModelFetch:
    """A model over every node: why its cells cannot run (None: they can), and what fetching took."""

    problem: str | None
    seconds: float = 0.0  # the slowest node's
    bytes: int = 0
    files: int = 0
    fetched: bool = False
    facts: ModelFacts | None = None

    def line(self, repo: str, nodes: int) -> str:
        """The model's outcome, as the driver prints it."""
        if self.problem is not None:
            return f"{repo}: not available, its cells are skipped: {self.problem}"
        size = f"{self.bytes / GB:.1f} GB" if self.bytes >= GB else f"{self.bytes / MB:.1f} MB"
        what = f"{size} in {self.files} files"
        if not self.fetched:
            return f"{repo}: {what} found in the Hub cache on {nodes} node(s) (HF_HUB_OFFLINE: nothing fetched)"
        return f"{repo}: {what} ready on {nodes} node(s) in {self.seconds:.0f} s (outside every cell's numbers)"


def combine(outcomes: list[tuple[str, NodeFetch]]) -> ModelFetch:
    """One model's outcome over its nodes: a cell may land on any of them, so one node's problem is the
    model's (named with its node where there are several)."""
    failed = [(node, fetch.problem) for node, fetch in outcomes if fetch.problem is not None]
    if failed:
        node, problem = failed[0]
        return ModelFetch(f"{problem} (on node {node})" if len(outcomes) > 1 else problem)
    first = outcomes[0][1]
    seconds = max(fetch.seconds for _, fetch in outcomes)
    return ModelFetch(None, seconds, first.bytes, first.files, any(f.fetched for _, f in outcomes), first.facts)


def prefetch(
    models: list[str],
    settings: HubSettings,
    say: Callable[[str], None],
    source: HubSource | None = None,
    with_code: bool = False,
    device: str = "cpu",
    timeout_s: float = FETCH_TIMEOUT_S,
) -> dict[str, ModelFetch]:
    """Each model on every node that runs cells, in one task per (model, node); progress every
    `PROGRESS_EVERY_S`, each model's outcome as its last node answers."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    resource = "GPU" if device == "cuda" else "CPU"
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource, 0) >= 1]
    if not models or not nodes:
        return {}
    source = source or HfHubSource()
    verb = "checking the Hub cache for" if settings.offline else "fetching"
    say(f"{verb} {len(models)} Hub model(s) on {len(nodes)} node(s) before any cell: {', '.join(models)}")
    task = ray.remote(num_cpus=0, max_retries=0)(fetch_on_node)
    pending: dict[Any, tuple[str, str]] = {}
    for node in nodes:
        placed = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        for model in models:
            pending[placed.remote(model, settings, source, with_code)] = (model, node["NodeManagerAddress"])
    answers: dict[str, list[tuple[str, NodeFetch]]] = {model: [] for model in models}
    results: dict[str, ModelFetch] = {}
    started = time.monotonic()
    while pending:
        left = timeout_s - (time.monotonic() - started)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, min(PROGRESS_EVERY_S, left)))
        if not ready and left <= 0:
            break
        if not ready:
            waiting = sorted({model for model, _ in pending.values()})
            say(f"still fetching after {time.monotonic() - started:.0f} s: {', '.join(waiting)}")
            continue
        model, node = pending.pop(ready[0])
        try:
            answer: NodeFetch = ray.get(ready[0])
        except Exception as exc:  # the task itself died (its node went away)
            answer = NodeFetch(f"fetching {model} failed: {first_line(exc, REASON_CHARS)}")
        answers[model].append((node, answer))
        if len(answers[model]) == len(nodes):
            results[model] = combine(answers[model])
            say(results[model].line(model, len(nodes)))
    for ref, (model, _) in pending.items():  # past the time allowed: those models' cells are skipped
        ray.cancel(ref, force=True)
        if model not in results:
            results[model] = ModelFetch(f"fetching {model} took longer than {timeout_s:.0f} s")
            say(results[model].line(model, len(nodes)))
    return results


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


def fetch_for_sweep(
    cfg: "KvSweepConfig",
    device: str,
    limits: "PlanLimits",
    source: "JobSource",
    tracking: "Tracking",
    hub_folder: str,
    say: Callable[[str], None],
) -> dict[str, str]:
    """The sweep's prefetch stage: the Hub models its pending cells need, fetched once per node. The cells of
    one that cannot be are skipped with the reason; one the plan could not read here is planned again from its
    fetched files. The time is the parent run's `hub_fetch_s`. Returns each fetched model with its cache ("":
    each node's default), from which the cells load it offline."""
    from kvsweep.driver.hub_node_fetch import hub_settings, source_for
    from kvsweep.driver.sweep_tracking import log_parent_metric
    from kvsweep.names import HUB_FETCH_S
    from kvsweep.plan.cell_plan import plan_cell

    pending = source.pending(tracking.done)
    models = models_to_fetch(pending, source.problems)
    if not models:
        return {}
    settings, started = hub_settings(), time.monotonic()
    fetches = prefetch(models, settings, say, source_for(hub_folder), cfg.trust_remote_code, device)
    log_parent_metric(tracking, HUB_FETCH_S, time.monotonic() - started, say)

    def replan(cell: Cell, facts: ModelFacts) -> PlannedCell:  # from the files the nodes fetched
        return plan_cell(
            cell,
            device,
            facts.shape,
            parameters=facts.planned_parameters,
            device_bytes=limits.device_bytes,
            skip_predicted_oom=cfg.planner.skip_predicted_oom,
            host=limits.host,
            gpus=limits.gpus,
            layout=facts.layout,
        )

    after, problems = plan_after(pending, source.problems, fetches, replan if source.replans_after_fetch else None)
    source.replace(pending, after, problems)
    return {m: settings.cache_dir or "" for m, fetch in fetches.items() if fetch.problem is None}
