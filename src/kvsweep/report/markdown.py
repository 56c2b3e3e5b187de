"""The selection table as Markdown (selection.md, logged on the parent run) and as terminal lines."""

from collections.abc import Sequence

from kvsweep.caches import BASELINE
from kvsweep.names import TASK_JSONL, Metric, ci_high, ci_low
from kvsweep.report.capacity_report import CapacitySection
from kvsweep.report.markdown_tables import (
    TableCell,
    capacity_markdown,
    table,
    task_quality_markdown,
    weights_kv_markdown,
    workload_markdown,
)
from kvsweep.report.pareto_table import front_text
from kvsweep.report.quality_gate import MAX_REFERENCE_WIDTH, MIN_REFERENCE_ACCURACY
from kvsweep.report.selection import MEMORY_LABELS, OBJECTIVE_WORDS, TIE_RULE, Decision, Entry, cost_text
from kvsweep.report.table import Listing
from kvsweep.report.task_accuracy import depth_accuracies, task_accuracies
from kvsweep.report.task_table import task_tables
from kvsweep.report.weights_tables import WeightsKvTable, origin_notes
from kvsweep.report.workload_report import WorkloadSection
from kvsweep.units import MIB


def short_form(decisions: list[Decision], left_out: str = "", capacity: Sequence[str] = ()) -> str:
    """Printed under the results table at the end of a sweep: one line per group, the note on groups left out
    of the list (`decision_list.py`), then the capacity heading and its line per size (`capacity_assessment.py`)."""
    lines = []
    if decisions:
        settings = decisions[0].settings
        lines.append(
            f"Selection ({OBJECTIVE_WORDS[settings.objective]} by {_ranked_words(settings.objective, settings.rank_by)}"
            f", never slower than dynamic by more than {settings.max_slowdown:.0%} on another latency; ties within "
            f"95% intervals (paired where caches served the same requests) broken by memory; leanest = least "
            f"{MEMORY_LABELS[decisions[0].memory_basis]} within {settings.max_slowdown:.0%} of the fastest):"
        )
        lines += [f"  {d.summary()}" for d in decisions]
    if left_out:
        lines.append(f"  ({left_out})")
    if capacity:
        lines += [capacity[0], *(f"  {line}" for line in capacity[1:])]
    return "\n".join(lines)


def _ranked_words(objective: str, rank_by: str) -> str:
    """What the objective ranks by, in the header's words."""
    return {"memory": "memory", "throughput": "tokens/s", "goodput": "requests/s within the SLOs"}.get(
        objective, rank_by
    )


def _num(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def _with_interval(metrics: dict[str, float], name: str) -> str:
    """'2.05 [1.85-2.24]': the median and its 95% interval."""
    if name not in metrics:
        return "-"
    low, high = metrics.get(ci_low(name)), metrics.get(ci_high(name))
    interval = f" [{low:.2f}-{high:.2f}]" if low is not None and high is not None else ""
    return f"{metrics[name]:.2f}{interval}"


def _link(entry: Entry | None, links: dict[str, str], after: str = "") -> TableCell:
    if entry is None:
        return "-"
    url = links.get(entry.result.cell_id)
    return (entry.label, url, after) if url else entry.label + after


def decision_rows(decisions: list[Decision], links: dict[str, str]) -> tuple[list[str], list[list[TableCell]]]:
    """Header and rows of the one-row-per-group table (shared by Markdown and HTML)."""
    settings = decisions[0].settings if decisions else None
    within = f"{settings.max_slowdown:.0%}" if settings else ""
    ranked = f" by {settings.rank_by}" if settings else ""
    header = ["model", "dtype", "batch", "context", "new tokens", f"pick{ranked}", f"leanest within {within}", "notes"]
    rows = []
    for d in decisions:
        model, dtype, batch, context, new, _, workload, serving, rate = d.key
        if workload:  # a workload group: its mix, serving mode and offered rate stand for the shape
            context, new = f"{workload} ({serving}{f' at {rate:g} req/s' if rate else ''})", "mix"
        failed = [f"{e.label}: {e.status}" for e in d.entries if e.status != "ok"]
        refused = [f"{e.label}: refused, {reason}" for e in d.refused() for reason in e.gate.refusals]
        flagged = [f"{e.label}: {flag}" for e in d.entries if e.status == "ok" for flag in e.gate.drift]
        pick = _link(d.pick, links, f" ({'; '.join(_pick_notes(d))})" if d.pick else "")
        contended = [f"{e.label}: CONTENDED ({e.contention})" for e in d.deciding() if e.contention]
        leanest = _link(d.leanest, links, f" ({cost_text(d.leanest)})" if d.leanest and d.leanest.deltas else "")
        row = [d.model_name or model, dtype, str(batch), str(context), str(new), pick, leanest]
        task = [d.uninformative] if d.uninformative else []  # the task judged nothing in this group
        held = [f"not picked: {line}" for line in d.held_back()]
        ranked = [d.ranking.note] if d.ranking.note else []
        pareto = [text] if (text := front_text(d)) else []
        rows.append([*row, "; ".join(ranked + held + contended + task + refused + failed + flagged + pareto)])
    return header, rows


def _pick_notes(decision: Decision) -> list[str]:
    """Why it is the pick (the fastest, or the tie-break among the tied) and its cost against dynamic."""
    assert decision.pick is not None
    why = [_pick_name(decision)]
    if decision.tied:
        tied = ", ".join(e.label for e in decision.tied)
        why = [f"tied within noise: {tied} ({decision.tie_test}); {TIE_RULE}"]
    tasks = decision.pick.gate.tasks
    if len(tasks) == 1:
        task = tasks[0]
        quality = [f"{task.mine.task} {task.mine.text()} vs dynamic {task.dynamic.text()}: {task.verdict}"]
        quality[0] += f" ({task.paired.text() if task.paired else task.test})"
    else:
        quality = (
            ["; ".join(f"{t.mine.task} {t.mine.value:.2f} vs {t.dynamic.value:.2f}: {t.verdict}" for t in tasks)]
            if tasks
            else []
        )
    return why + ([cost_text(decision.pick)] if decision.pick.deltas else []) + quality


def task_text(entry: Entry) -> str:
    """'passkey 0.94 [0.70-1.00] (depth 10: 1.00, 50: 0.88, 90: 0.94)': each task's accuracy and interval, passkey's
    per depth ('; ' between the tasks of a suite)."""
    accuracies = task_accuracies(entry.result.metrics) if entry.status == "ok" else []
    if not accuracies:
        return "-"
    depths = depth_accuracies(entry.result.metrics)
    by_depth = f" (depth {', '.join(f'{d}: {v:.2f}' for d, v in depths)})" if len(depths) > 1 else ""
    texts = [f"{a.task} {a.text()}{by_depth if a.metric == Metric.PASSKEY_ACCURACY else ''}" for a in accuracies]
    return "; ".join(texts)


def _task_cell(entry: Entry, links: dict[str, str]) -> TableCell:
    """The accuracy, linked to the cell's `task.jsonl` (every prompt's expected and given answer) in MLflow."""
    text, url = task_text(entry), links.get(entry.result.cell_id)
    return (text, f"{url}/artifactPath/{TASK_JSONL}", "") if url and text != "-" else text


def verdict_text(entry: Entry) -> str:
    """The task verdict against dynamic (of a suite, the worst task's): ok, loss, undecided; 'baseline' for
    dynamic's own cell."""
    if entry.gate.worst:
        return entry.gate.worst
    if entry.label == BASELINE and entry.status == "ok" and task_accuracies(entry.result.metrics):
        return "baseline"
    return "-"


def _pick_name(decision: Decision) -> str:
    if decision.alone:
        return "the only one that ran"
    return "pick of the tied" if decision.tied else OBJECTIVE_WORDS[decision.settings.objective]


def evidence_rows(decisions: list[Decision], links: dict[str, str]) -> tuple[list[str], list[list[TableCell]]]:
    """Every strategy of every group: its numbers, its cost against dynamic, flags and advice."""
    basis = decisions[0].memory_basis if decisions else Metric.KV_CACHE_BYTES
    header = [
        "group",
        "model reference",
        "strategy",
        "status",
        "TPOT ms",
        "TTFT ms",
        f"{MEMORY_LABELS[basis]} MiB",
        "vs dynamic",
        "task (95% interval)",
        "task vs dynamic",
        "agreement",
        "KL (nats)",
        "flags / advice",
    ]
    rows = []
    for d in decisions:
        for e in d.entries:
            m = e.result.metrics
            picked = [name for name, chosen in ((_pick_name(d), d.pick), ("leanest", d.leanest)) if chosen is e]
            notes = [*(f"**{p}**" for p in picked), *e.flags, *([e.advice] if e.advice else [])]
            if e.status != "ok" and e.result.error and e.status != "skipped":
                notes.append(e.result.error[:160])
            rows.append(
                [
                    d.label,
                    d.key[0],  # the full reference (a path or Hub id), as in the cell's `model` param
                    _link(e, links),
                    e.status,
                    _with_interval(m, Metric.TPOT_MS) if e.status == "ok" else "-",
                    _with_interval(m, Metric.TTFT_MS) if e.status == "ok" else "-",
                    _num(e.memory, MIB) if e.status == "ok" else "-",
                    cost_text(e) or ("baseline" if e.label == BASELINE and e.status == "ok" else "-"),
                    _task_cell(e, links),
                    verdict_text(e),
                    _num(m.get(Metric.TOKEN_AGREEMENT)) if e.status == "ok" else "-",
                    f"{m[Metric.KL_DIVERGENCE]:.2e}" if e.status == "ok" and Metric.KL_DIVERGENCE in m else "-",
                    "; ".join(notes),
                ]
            )
    return header, rows


def intro(decisions: list[Decision]) -> str:
    """How the picks were made, in one paragraph (Markdown and HTML)."""
    if not decisions:
        return ""
    s = decisions[0].settings
    basis = MEMORY_LABELS[decisions[0].memory_basis]
    return (
        f"Pick ({s.objective}): among strategies that ran, fit and kept their quality, and that are not slower "
        f"than dynamic by more than {s.max_slowdown:.0%} on any latency (TTFT, TPOT, E2E at the ranked statistic; "
        "'not picked' names the slowdown) nor past an SLO set, the best by the objective: latency, the lowest "
        f"{s.rank_by} (a fixed shape's median; over a request mix, the percentile asked or the highest its "
        "requests can give a 95% interval); memory, the least; throughput, the most tokens/s; goodput, the most "
        "requests/s within the SLOs. When the best cannot be told apart from others (a fixed shape's 95% intervals, "
        "shown in brackets, overlap; over a request mix, the paired sign test on the same requests' ratios), they are "
        "tied within noise and the pick is the one with the least memory, then the simpler strategy (dynamic first). "
        f"Leanest: the least {basis} among "
        f"strategies within {s.max_slowdown:.0%} of the fastest median. Costs are relative to `dynamic` on the same "
        "model, dtype, batch, context and new tokens; a timing's ± is its 95% uncertainty (both intervals in "
        "quadrature). CONTENDED marks cells measured while other processes took their CPUs or GPU "
        "(`kvsweep.contended`). Quality: where dynamic does the task (its accuracy at least "
        f"{MIN_REFERENCE_ACCURACY:.1f}, its interval no wider than {MAX_REFERENCE_WIDTH:.1f}), a strategy whose task "
        f"accuracy is more than {s.max_accuracy_drop:.2f} below dynamic's is refused (never picked) when the drop "
        "is significant (loss: McNemar's exact test on the trials both answered) and also while it is not "
        "(undecided: more measure.quality_trials decide); there the task decides alone. Where no task can judge "
        "(random ids, or a task dynamic itself "
        f"fails: uninformative), a strategy whose mean KL from dynamic exceeds {s.max_kl:g} nats is refused. "
        "Each accuracy links to the cell's task.jsonl (every prompt's expected and given answer). Token "
        f"agreement below {s.min_token_agreement:.2f} is only flagged, as is everything on random-weight presets."
    )


def selection_markdown(
    title: str,
    decisions: list[Decision],
    links: dict[str, str],
    listing: Listing | None = None,
    capacity: CapacitySection | None = None,
    weights_kv: Sequence[WeightsKvTable] = (),
    workloads: WorkloadSection | None = None,
) -> str:
    """The decision table lists `listing.listed` (default: every decision), the evidence table every decision;
    `weights_kv`: the weights x cache tables, when the sweep quantized weights; `workloads`: the workload
    section's tables, when the sweep replayed request mixes."""
    if not decisions:
        return "\n\n".join([f"# {title}", "No cells.", *(workload_markdown(workloads) if workloads else [])]) + "\n"
    listing = listing or Listing(decisions)
    listed = table(*decision_rows(listing.listed, links)) if listing.listed else "No group to choose in."
    return "\n\n".join(
        [
            f"# {title}",
            intro(decisions),
            *origin_notes(decisions),
            *(capacity_markdown(capacity) if capacity else []),
            "## Decision",
            *([f"_{listing.note()}._"] if listing.left_out else []),
            listed,
            "## Evidence",
            table(*evidence_rows(decisions, links)),
            *task_quality_markdown(task_tables(decisions)),
            *weights_kv_markdown(weights_kv),
            *(workload_markdown(workloads) if workloads else []),
            "",
        ]
    )
