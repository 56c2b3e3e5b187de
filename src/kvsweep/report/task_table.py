"""The quality table: each task's accuracy per cache and context, with the losses marked.

One table per model, dtype, batch, weights and new-token count that ran a task: a row per strategy, a column per
task and context (`multi-key NIAH @ 2048`). A cell is the accuracy and its exact 95% interval; a task dynamic
cannot do at that length says `uninformative` in its column head for that context and judges nothing there; a
verdict other than ok is written beside the accuracy (`LOSS`, `undecided`). This is where a reader sees *which*
task a cache fails and from what length on.
"""

from dataclasses import dataclass

from kvsweep.report.quality_gate import LOSS, UNDECIDED
from kvsweep.report.selection import Decision
from kvsweep.report.selection_entry import Entry
from kvsweep.report.task_accuracy import task_accuracies

MARKS = {LOSS: " LOSS", UNDECIDED: " undecided"}
INTRO = (
    "Each task's accuracy with its exact 95% interval, per strategy and context. LOSS: below dynamic's by more than "
    "report.max_accuracy_drop, significant by McNemar's exact test on the same trials; undecided: below it, not yet "
    "significant. A task marked uninformative at a context is one dynamic cannot do there: it judges nothing."
)


@dataclass(frozen=True)
class TaskTable:
    title: str
    header: list[str]
    rows: list[list[str]]


def task_tables(decisions: list[Decision]) -> list[TaskTable]:
    """The quality tables of every fixed-shape group family that answered a task; none without a task."""
    families: dict[tuple, list[Decision]] = {}
    for decision in decisions:
        model, dtype, batch, _, new, weights, workload, _, _ = decision.key
        if workload:
            continue
        families.setdefault((model, dtype, batch, new, weights), []).append(decision)
    tables = []
    for (_, dtype, batch, new, weights), family in families.items():
        table = _table(sorted(family, key=lambda d: d.key[3]))
        if table is not None:
            name = family[0].model_name or family[0].key[0]
            on = f", weights {weights}" if weights and weights != "none" else ""
            tables.append(TaskTable(f"{name} {dtype} bs{batch} new{new}{on}", *table))
    return tables


def _table(family: list[Decision]) -> tuple[list[str], list[list[str]]] | None:
    columns: list[tuple[int, str, str]] = []  # context, metric, head
    for decision in family:
        context = decision.key[3]
        standing = next((e.gate.standing for e in decision.entries if e.status == "ok"), None)
        uninformative = {metric for metric, _ in standing.uninformative} if standing else set()
        seen: dict[str, str] = {}
        for entry in decision.entries:
            if entry.status != "ok":
                continue
            for accuracy in task_accuracies(entry.result.metrics):
                off = " (uninformative)" if accuracy.metric in uninformative else ""
                seen.setdefault(accuracy.metric, f"{accuracy.task} @ {context}{off}")
        columns += [(context, metric, head) for metric, head in seen.items()]
    if not columns:
        return None
    labels = list(dict.fromkeys(e.label for d in family for e in d.entries))
    rows = []
    for label in labels:
        row = [label]
        for context, metric, _ in columns:
            decision = next(d for d in family if d.key[3] == context)
            entry = next((e for e in decision.entries if e.label == label), None)
            row.append(_cell(entry, metric))
        rows.append(row)
    return ["strategy", *(head for _, _, head in columns)], rows


def _cell(entry: Entry | None, metric: str) -> str:
    if entry is None:
        return ""
    if entry.status != "ok":
        return entry.status
    accuracy = next((a for a in task_accuracies(entry.result.metrics) if a.metric == metric), None)
    if accuracy is None:
        return "-"
    verdict = next((t.verdict for t in entry.gate.tasks if t.mine.metric == metric), "")
    return accuracy.text() + MARKS.get(verdict, "")
