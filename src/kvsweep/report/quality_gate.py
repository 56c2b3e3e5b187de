"""Does a strategy still do the job? Each task's accuracy against dynamic's, its KL from dynamic, and flags.

The rules and their reasons are in docs/report.md ("Quality"). In short: dynamic's cell of the same group (model,
dtype, batch, context) is the reference, and each task (the suite's, `inputs.tasks`, or a prompts file's answers)
is *informative* when dynamic scores at least `MIN_REFERENCE_ACCURACY` on it with an interval no wider than
`MAX_REFERENCE_WIDTH`; a task dynamic cannot do at that length gates nothing. Where one is informative, the
informative tasks decide alone, each on its own, and a loss on any refuses the strategy:
*ok* within the allowed drop, *loss* beyond it when the drop is significant, *undecided* otherwise (refused too, as
a few dozen prompts cannot tell that drop from luck). Both cells answered the very same trials, so significance is
McNemar's exact test on the trials they disagree on (`measure/paired.py`); only where the trials are not at hand
(a report rebuilt from MLflow) do the two accuracies' independent intervals decide, and the verdict says which.
Elsewhere the mean teacher-forced KL from dynamic decides against `max_kl`. Token agreement is
reported only: greedy tokens diverge after one near-tie. On a random-weight preset everything is a flag.

Pure functions over results (no torch, no MLflow): the selection, the report and the
`kvsweep.quality_loss` tag all read the same verdict.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from kvsweep.measure.paired import PairedAccuracy
from kvsweep.names import Metric, ResultTag, task_of_metric
from kvsweep.report.paired_verdicts import paired_trials
from kvsweep.report.task_accuracy import Accuracy, finite, task_accuracies
from kvsweep.results import CellResult

OK_VERDICT, LOSS, UNDECIDED = "ok", "loss", "undecided"
LOSS_TAG_VALUES = {OK_VERDICT: "false", LOSS: "true", UNDECIDED: "undecided"}
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
    """Whether the group's tasks can judge its caches: informative, uninformative (and why), or none; with several
    tasks, which are which."""

    kind: str = NO_TASK  # informative (one task at least) | uninformative (none is) | none
    why: str = ""  # uninformative: 'passkey uninformative at ctx 2048: dynamic 0.31 [0.11-0.59]'
    informative: tuple[str, ...] = ()  # the tasks that judge, by metric
    uninformative: tuple[tuple[str, str], ...] = ()  # (metric, why) of those that cannot

    def tag(self) -> str:
        """The `kvsweep.task` tag's value: 'informative', 'uninformative: why', or with several tasks
        'informative: niah_single, vt; uninformative: cwe (dynamic 0.31 [0.11-0.59])'."""
        if len(self.informative) + len(self.uninformative) <= 1:
            return f"{UNINFORMATIVE}: {self.why}" if self.kind == UNINFORMATIVE else self.kind
        parts = []
        if self.informative:
            parts.append(f"{INFORMATIVE}: {', '.join(_short(m) for m in self.informative)}")
        if self.uninformative:
            parts.append(f"{UNINFORMATIVE}: {', '.join(f'{_short(m)} ({why})' for m, why in self.uninformative)}")
        return "; ".join(parts)


def _short(metric: str) -> str:
    return "answers" if metric == Metric.ANSWER_ACCURACY else task_of_metric(metric) or metric


def task_standing(result: CellResult, dynamic: CellResult | None) -> TaskStanding:
    """none without a task; per task, uninformative when dynamic (the reference) is missing, answered no such task,
    or scores below `MIN_REFERENCE_ACCURACY` or with an interval wider than `MAX_REFERENCE_WIDTH`; informative
    when one task at least is."""
    mine = task_accuracies(result.metrics)
    if not mine:
        return TaskStanding()
    context = int(result.cell.context_length)
    theirs = {a.metric: a for a in task_accuracies(dynamic.metrics)} if dynamic is not None else {}
    informative, uninformative = [], []
    for accuracy in mine:
        reference = theirs.get(accuracy.metric)
        if dynamic is None:
            why = f"{accuracy.task} unjudged at ctx {context}: no dynamic cell ran"
        elif reference is None:
            why = f"{accuracy.task} unjudged at ctx {context}: dynamic answered no such task"
        elif (
            reference.value < MIN_REFERENCE_ACCURACY - SHARE_TOLERANCE
            or reference.high - reference.low > MAX_REFERENCE_WIDTH + SHARE_TOLERANCE
        ):
            why = f"{accuracy.task} uninformative at ctx {context}: dynamic {reference.text()}"
        else:
            informative.append(accuracy.metric)
            continue
        uninformative.append((accuracy.metric, why))
    if informative:
        return TaskStanding(INFORMATIVE, "", tuple(informative), tuple(uninformative))
    return TaskStanding(UNINFORMATIVE, "; ".join(why for _, why in uninformative), (), tuple(uninformative))


@dataclass(frozen=True)
class Gate:
    """What quality says about one cell that ran: its task verdict, why it may not be picked, what to flag."""

    tasks: tuple[TaskVerdict, ...] = ()  # one verdict per informative task, in the suite's order
    refusals: tuple[str, ...] = ()  # any of them keeps the strategy from being picked
    flags: tuple[str, ...] = ()  # reported, never deciding
    standing: TaskStanding = TaskStanding()  # whether the tasks could judge this cell

    @property
    def task(self) -> TaskVerdict | None:
        """The verdict the line repeats: the first task that refused the strategy, else the first that judged."""
        return (
            next((t for t in self.tasks if t.verdict == LOSS), None)
            or next((t for t in self.tasks if t.verdict == UNDECIDED), None)
            or next(iter(self.tasks), None)
        )

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

    @property
    def worst(self) -> str:
        """loss if any task lost, undecided if any could not tell, ok otherwise ('' without a verdict)."""
        verdicts = {t.verdict for t in self.tasks}
        return next((v for v in (LOSS, UNDECIDED, OK_VERDICT) if v in verdicts), "")


def task_verdict(
    result: CellResult, dynamic: CellResult | None, max_accuracy_drop: float, metric: str | None = None
) -> TaskVerdict | None:
    """On the task of `metric` (None: the cell's first): ok within the drop; loss when further below and the drop
    is significant (McNemar on that task's paired trials, or without them the two intervals apart); undecided
    otherwise.

    None without a dynamic cell, or without that accuracy on either."""
    if dynamic is None or result is dynamic:
        return None
    metric = metric or next((a.metric for a in task_accuracies(result.metrics)), None)
    mine = next((a for a in task_accuracies(result.metrics) if a.metric == metric), None)
    theirs = next((a for a in task_accuracies(dynamic.metrics) if a.metric == metric), None)
    if mine is None or theirs is None:
        return None
    paired = paired_trials(result, dynamic, mine.trial_kind)
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
    kl = finite(metrics, Metric.KL_DIVERGENCE)
    return f"KL {kl:.3g} nats > {max_kl:g} from dynamic" if kl is not None and kl > max_kl else ""


def agreement_text(metrics: Mapping[str, float], min_token_agreement: float) -> str:
    """'token agreement 0.40 < 0.90' when greedy tokens agree with dynamic's less than the threshold, else ''."""
    agreement = finite(metrics, Metric.TOKEN_AGREEMENT)
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
    uninformative = [why for _, why in standing.uninformative] if result is not dynamic else []
    if standing.kind == INFORMATIVE:
        verdicts = [task_verdict(result, dynamic, max_accuracy_drop, metric) for metric in standing.informative]
        tasks = tuple(v for v in verdicts if v is not None)
        reasons = tuple(reason for t in tasks if (reason := t.reason()))
        # the tasks decide; a KL over the limit is shown beside kept tasks, never refusing alone
        kl_flag = [f"{kl}, task{'s' * (len(tasks) > 1)} kept"] if kl and tasks and not reasons else []
        return Gate(tasks, reasons, (*kl_flag, *uninformative, *flags), standing)
    return Gate((), (kl,) if kl else (), (*uninformative, *flags), standing)


def gate_tags(gate: Gate) -> dict[str, str]:
    """`kvsweep.task` (informative, uninformative: why, none) and `kvsweep.quality_loss`: true (loss),
    undecided, false (ok), the latter only with a task verdict."""
    tags = {ResultTag.TASK: gate.standing.tag()}
    if gate.worst:
        tags[ResultTag.QUALITY_LOSS] = LOSS_TAG_VALUES[gate.worst]
    return tags
