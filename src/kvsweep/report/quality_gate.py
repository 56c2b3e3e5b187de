"""Does a strategy still do the job? Its task accuracy against dynamic's, its KL from dynamic, and flags.

The rules and their reasons are in docs/report.md ("Quality"). In short: dynamic's cell of the same group (model,
dtype, batch, context) is the reference, and its task is *informative* when dynamic scores at least
`MIN_REFERENCE_ACCURACY` with an interval no wider than `MAX_REFERENCE_WIDTH`. There the task decides alone:
*ok* within the allowed drop, *loss* beyond it when the drop is significant, *undecided* otherwise (refused too, as
a few dozen prompts cannot tell that drop from luck). Both cells answered the very same trials, so significance is
McNemar's exact test on the trials they disagree on (`measure/paired.py`); only where the trials are not at hand
(a report rebuilt from MLflow) do the two accuracies' independent intervals decide, and the verdict says which.
Elsewhere the mean teacher-forced KL from dynamic decides against `max_kl`. Token agreement is
reported only: greedy tokens diverge after one near-tie. On a random-weight preset everything is a flag.

Pure functions over results (no torch, no MLflow): the selection, the report and the
`kvsweep.quality_loss` tag all read the same verdict.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvsweep.measure.paired import PairedAccuracy
from kvsweep.names import ACCURACIES, PASSKEY_DEPTH_PREFIX, Metric, ResultTag, ci_high, ci_low
from kvsweep.report.paired_verdicts import paired_trials
from kvsweep.results import CellResult

OK_VERDICT, LOSS, UNDECIDED = "ok", "loss", "undecided"
LOSS_TAG_VALUES = {OK_VERDICT: "false", LOSS: "true", UNDECIDED: "undecided"}
TASK_NAMES = {Metric.PASSKEY_ACCURACY: "passkey", Metric.ANSWER_ACCURACY: "answers"}
# Shares are counts over trials and the limit a decimal: 0.90 - 0.85 is 0.05000000000000004 in floats.
SHARE_TOLERANCE = 1e-9
UNDECIDED_ADVICE = "undecided, run more measure.quality_trials"
REFUSED_ADVICE = "quality below dynamic's here: keep dynamic (for a quantized cache, try more bits)"
AGREEMENT_PREFIX = "token agreement"
SHAPE_ONLY_FLAG = "shape-only (random weights): no task run, quality only flagged"
# The reference must do the task for the task to judge anything: dynamic at least this accurate...
MIN_REFERENCE_ACCURACY = 0.7
# ...and its exact 95% interval no wider than this (fewer trials than that cannot tell much from little).
MAX_REFERENCE_WIDTH = 0.5
INFORMATIVE, UNINFORMATIVE, NO_TASK = "informative", "uninformative", "none"


@dataclass(frozen=True)
class Accuracy:
    """A cell's task accuracy and its 95% interval (a point where a result has no interval)."""

    metric: str
    value: float
    low: float
    high: float

    @property
    def task(self) -> str:
        return TASK_NAMES.get(self.metric, self.metric)

    def text(self) -> str:
        """'0.31 [0.11-0.59]'."""
        return f"{self.value:.2f} [{self.low:.2f}-{self.high:.2f}]"


@dataclass(frozen=True)
class TaskVerdict:
    verdict: str  # ok | loss | undecided
    mine: Accuracy
    dynamic: Accuracy
    context: int
    paired: PairedAccuracy | None = None  # McNemar on the same trials; None: the independent intervals decided

    @property
    def test(self) -> str:
        """The test the verdict came from, as the report names it."""
        return "McNemar exact, paired trials" if self.paired else "independent intervals"

    def text(self) -> str:
        """'passkey 0.31 [0.11-0.59] vs dynamic 0.94 [0.70-1.00] at ctx 32768 (paired -0.62 [-0.85, -0.38],
        McNemar p=0.0005 (lost 10, gained 0 of 16))'."""
        head = f"{self.mine.task} {self.mine.text()} vs dynamic {self.dynamic.text()} at ctx {self.context}"
        return f"{head} (paired {self.paired.text()})" if self.paired else f"{head} ({self.test})"

    def reason(self) -> str:
        """Why the strategy is refused ('' when it is not)."""
        if self.verdict == LOSS:
            return f"{self.text()}: quality loss"
        if self.verdict == UNDECIDED:
            return f"{self.text()}: {UNDECIDED_ADVICE}"
        return ""


@dataclass(frozen=True)
class TaskStanding:
    """Whether the group's task can judge its caches: informative, uninformative (and why), or none."""

    kind: str = NO_TASK  # informative | uninformative | none
    why: str = ""  # uninformative: 'passkey uninformative at ctx 2048: dynamic 0.31 [0.11-0.59]'

    def tag(self) -> str:
        """The `kvsweep.task` tag's value."""
        return f"{UNINFORMATIVE}: {self.why}" if self.kind == UNINFORMATIVE else self.kind


def task_standing(result: CellResult, dynamic: CellResult | None) -> TaskStanding:
    """none without a task; uninformative when dynamic (the reference) is missing, answered another task, or
    scores below `MIN_REFERENCE_ACCURACY` or with an interval wider than `MAX_REFERENCE_WIDTH`."""
    mine = task_accuracy(result.metrics)
    if mine is None:
        return TaskStanding()
    context = int(result.cell.context_length)
    if dynamic is None:
        return TaskStanding(UNINFORMATIVE, f"{mine.task} unjudged at ctx {context}: no dynamic cell ran")
    theirs = task_accuracy(dynamic.metrics)
    if theirs is None or theirs.metric != mine.metric:
        return TaskStanding(UNINFORMATIVE, f"{mine.task} unjudged at ctx {context}: dynamic answered no such task")
    width = theirs.high - theirs.low
    if theirs.value < MIN_REFERENCE_ACCURACY - SHARE_TOLERANCE or width > MAX_REFERENCE_WIDTH + SHARE_TOLERANCE:
        return TaskStanding(UNINFORMATIVE, f"{mine.task} uninformative at ctx {context}: dynamic {theirs.text()}")
    return TaskStanding(INFORMATIVE)


@dataclass(frozen=True)
class Gate:
    """What quality says about one cell that ran: its task verdict, why it may not be picked, what to flag."""

    task: TaskVerdict | None = None
    refusals: tuple[str, ...] = ()  # any of them keeps the strategy from being picked
    flags: tuple[str, ...] = ()  # reported, never deciding
    standing: TaskStanding = TaskStanding()  # whether the task could judge this cell

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    @property
    def drift(self) -> tuple[str, ...]:
        """The token-agreement flag, if any (the one quality flag the decision's line repeats)."""
        return tuple(flag for flag in self.flags if flag.startswith(AGREEMENT_PREFIX))

    @property
    def advice(self) -> str:
        if not self.refused:
            return ""
        return REFUSED_ADVICE if self.task is None or self.task.verdict == LOSS else ""


def _finite(metrics: Mapping[str, float], name: str) -> float | None:
    value = metrics.get(name)
    return None if value is None or not math.isfinite(value) else float(value)


def task_accuracy(metrics: Mapping[str, float]) -> Accuracy | None:
    """The cell's task accuracy (passkey or a prompts file's answers), None when it answered no task."""
    for metric in ACCURACIES:
        value = _finite(metrics, metric)
        if value is not None:
            low, high = _finite(metrics, ci_low(metric)), _finite(metrics, ci_high(metric))
            return Accuracy(metric, value, value if low is None else low, value if high is None else high)
    return None


def depth_accuracies(metrics: Mapping[str, float]) -> list[tuple[int, float]]:
    """Passkey accuracy per needle depth (percent of the context), shallowest first."""
    depths = []
    for name, value in metrics.items():
        suffix = name.removeprefix(PASSKEY_DEPTH_PREFIX)
        if suffix != name and suffix.isdigit() and math.isfinite(value):
            depths.append((int(suffix), float(value)))
    return sorted(depths)


def task_verdict(result: CellResult, dynamic: CellResult | None, max_accuracy_drop: float) -> TaskVerdict | None:
    """ok within the drop; loss when further below and the drop is significant (McNemar on the paired trials, or
    without them the two intervals apart); undecided otherwise.

    None without a dynamic cell, without an accuracy on either, or when they answered different tasks."""
    if dynamic is None or result is dynamic:
        return None
    mine, theirs = task_accuracy(result.metrics), task_accuracy(dynamic.metrics)
    if mine is None or theirs is None or mine.metric != theirs.metric:
        return None
    paired = paired_trials(result, dynamic)
    drop = paired.drop if paired is not None else theirs.value - mine.value
    significant = paired.high < 0 if paired is not None else mine.high < theirs.low
    if drop <= max_accuracy_drop + SHARE_TOLERANCE:
        verdict = OK_VERDICT
    elif significant:
        verdict = LOSS
    else:
        verdict = UNDECIDED
    return TaskVerdict(verdict, mine, theirs, int(result.cell.context_length), paired)


def kl_text(metrics: Mapping[str, float], max_kl: float) -> str:
    """'KL 0.066 nats > 0.02 from dynamic' when the mean teacher-forced KL exceeds the limit, else ''."""
    kl = _finite(metrics, Metric.KL_DIVERGENCE)
    return f"KL {kl:.3g} nats > {max_kl:g} from dynamic" if kl is not None and kl > max_kl else ""


def agreement_text(metrics: Mapping[str, float], min_token_agreement: float) -> str:
    """'token agreement 0.40 < 0.90' when greedy tokens agree with dynamic's less than the threshold, else ''."""
    agreement = _finite(metrics, Metric.TOKEN_AGREEMENT)
    if agreement is None or agreement >= min_token_agreement:
        return ""
    return f"{AGREEMENT_PREFIX} {agreement:.2f} < {min_token_agreement:.2f}"


def judge(
    result: CellResult,
    dynamic: CellResult | None,
    *,
    max_accuracy_drop: float,
    max_kl: float,
    min_token_agreement: float,
) -> Gate:
    """The gate for one cell that ran, against dynamic's cell that ran in its group (None: no such cell)."""
    shape_only = result.tags.get(ResultTag.SHAPE_ONLY) == "true"
    kl = kl_text(result.metrics, max_kl)
    agreement = agreement_text(result.metrics, min_token_agreement)
    flags = [agreement] if agreement else []
    standing = task_standing(result, dynamic)
    if shape_only:
        return Gate(flags=(*([kl] if kl else []), *flags, SHAPE_ONLY_FLAG), standing=standing)
    if standing.kind == INFORMATIVE:
        task = task_verdict(result, dynamic, max_accuracy_drop)
        reason = task.reason() if task else ""
        # the task decides; a KL over the limit is shown beside a kept task, never refusing alone
        kl_flag = [f"{kl}, task kept"] if kl and task is not None and not reason else []
        return Gate(task, (reason,) if reason else (), (*kl_flag, *flags), standing)
    uninformative = [standing.why] if standing.kind == UNINFORMATIVE and result is not dynamic else []
    return Gate(None, (kl,) if kl else (), (*uninformative, *flags), standing)


def gate_tags(gate: Gate) -> dict[str, str]:
    """`kvsweep.task` (informative, uninformative: why, none) and `kvsweep.quality_loss`: true (loss),
    undecided, false (ok), the latter only with a task verdict."""
    tags = {ResultTag.TASK: gate.standing.tag()}
    if gate.task is not None:
        tags[ResultTag.QUALITY_LOSS] = LOSS_TAG_VALUES[gate.task.verdict]
    return tags
