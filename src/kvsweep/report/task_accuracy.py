"""A cell's task accuracies as its metrics hold them: each task's share with its interval, read in the suite's order.

Pure reading (no verdict): the gate (`quality_gate.py`), the tables, the plots and the Pareto front all read a
cell's tasks the same way. A task is its `task_<name>_accuracy` metric (`passkey_accuracy` for the passkey), a
prompts file's answers `answer_accuracy`.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvsweep.inputs.spec import FILE
from kvsweep.inputs.tasks.suite import TASKS
from kvsweep.names import PASSKEY_DEPTH_PREFIX, Metric, ci_high, ci_low, task_of_metric

SUITE_ORDER = tuple(TASKS)


@dataclass(frozen=True)
class Accuracy:
    """A cell's task accuracy and its 95% interval (a point where a result has no interval)."""

    metric: str
    value: float
    low: float
    high: float

    @property
    def trial_kind(self) -> str:
        """The `kind` its trials carry in task.jsonl: the task's name, or `file` for a prompts file's answers."""
        return FILE if self.metric == Metric.ANSWER_ACCURACY else task_of_metric(self.metric) or self.metric

    @property
    def task(self) -> str:
        """As the report names it: 'passkey', 'multi-key NIAH', 'answers'."""
        if self.metric == Metric.ANSWER_ACCURACY:
            return "answers"
        name = task_of_metric(self.metric) or self.metric
        return TASKS[name].title if name in TASKS else name

    def text(self) -> str:
        """'0.31 [0.11-0.59]'."""
        return f"{self.value:.2f} [{self.low:.2f}-{self.high:.2f}]"


def finite(metrics: Mapping[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return None if value is None or not math.isfinite(value) else float(value)


def task_accuracies(metrics: Mapping[str, float]) -> list[Accuracy]:
    """Every task accuracy a cell has (the suite's tasks, in the suite's order; a prompts file's answers)."""
    found = []
    for metric in metrics:
        if metric == Metric.ANSWER_ACCURACY or task_of_metric(metric) is not None:
            value = finite(metrics, metric)
            if value is not None:
                low, high = finite(metrics, ci_low(metric)), finite(metrics, ci_high(metric))
                found.append(Accuracy(metric, value, value if low is None else low, value if high is None else high))
    return sorted(found, key=lambda a: _order(a.metric))


def _order(metric: str) -> tuple[int, str]:
    task = task_of_metric(metric)
    return (SUITE_ORDER.index(task), metric) if task in SUITE_ORDER else (len(SUITE_ORDER), metric)


def quality_score(metrics: Mapping[str, float]) -> tuple[str, float] | None:
    """One number for a cell's task quality, and what it is: its one accuracy (`passkey_accuracy`), or the mean
    of its suite's ('mean of 4 tasks'); None without a task. For a front or a column; the gate judges each task."""
    accuracies = task_accuracies(metrics)
    if not accuracies:
        return None
    if len(accuracies) == 1:
        return accuracies[0].metric, accuracies[0].value
    return f"mean of {len(accuracies)} tasks", sum(a.value for a in accuracies) / len(accuracies)


def task_accuracy(metrics: Mapping[str, float]) -> Accuracy | None:
    """The cell's first task accuracy (its only one, unless it ran a suite), None when it answered no task."""
    return next(iter(task_accuracies(metrics)), None)


def depth_accuracies(metrics: Mapping[str, float]) -> list[tuple[int, float]]:
    """Passkey accuracy per needle depth (percent of the context), shallowest first."""
    depths = []
    for name, value in metrics.items():
        suffix = name.removeprefix(PASSKEY_DEPTH_PREFIX)
        if suffix != name and suffix.isdigit() and math.isfinite(value):
            depths.append((int(suffix), float(value)))
    return sorted(depths)
