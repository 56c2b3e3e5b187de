"""Checks that a cell's numbers belong to the strategy it names, and the tags that say so.

The cache `generate` returned is the one the registry says the strategy produces; a compiled cell really compiled
(torch's own counter), compiled nothing more while measured (`compile_recaptures`) and, on CUDA, ran CUDA graphs
(`compile_cudagraph_skips`); decode moved no more bytes per second than the device can (`kvsweep.implausible`).
After the timed calls, quality: the answers the dynamic cache gives on the same inputs (token agreement,
teacher-forced KL), and the task. Prompts are the same for every strategy of a (model, batch, context) pair, in
whole batches of the cell's shape, greedy, each only as long as its answer needs.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from kvsweep.caches import BASELINE, CacheStrategy, get_strategy
from kvsweep.cell.call_inputs import Feed
from kvsweep.cell.generate_session import GenerateSession, MeasuredCall
from kvsweep.errors import out_of_memory
from kvsweep.grid import Cell
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.scoring import value_hits
from kvsweep.inputs.spec import FILE, PASSKEY
from kvsweep.inputs.tasks.suite import answer_budget as suite_answer_budget
from kvsweep.measure.bandwidth import Bandwidth, implausible
from kvsweep.measure.cache_identity import mismatch
from kvsweep.measure.peak_memory import HWM
from kvsweep.measure.quality import record_reference, reference_rows, teacher_forced_kl, token_agreement
from kvsweep.measure.statistics import exact_interval
from kvsweep.names import (
    Metric,
    ResultTag,
    ci_high,
    ci_low,
    passkey_depth_metric,
    task_accuracy_metric,
    task_partial_metric,
    task_trials_metric,
)


class WrongCacheError(Exception):
    """`generate` ran something other than what the cell asked for (a silent fallback)."""


def check_cache(strategy: CacheStrategy, call: MeasuredCall, cell: Cell) -> None:
    problem = mismatch(strategy, call.identity, cell.cached_tokens)
    if problem is not None:
        raise WrongCacheError(problem)


def check_compiled(strategy: CacheStrategy, session: GenerateSession) -> int:
    """After the cold call of a compiled cell: the graphs torch.compile produced in this process.

    Zero graphs (dynamo disabled, compile skipped by generate) or, on CPU, a compiled forward that
    was never called means the cell ran eager: an error, not a number labelled compiled.
    """
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"]["unique_graphs"])
    bypassed = not session.cuda and session.compiled_calls == 0
    if graphs == 0 or bypassed:
        raise WrongCacheError(f"asked for {strategy.name} compiled, but generate ran it eagerly (no graph compiled)")
    return graphs


class CompiledDuringMeasurement(Exception):
    """A compiled cell recompiled or re-captured a CUDA graph while being measured: its TPOT holds compiler work."""


def check_no_recapture(recaptures: int) -> None:
    if recaptures:
        raise CompiledDuringMeasurement(
            f"{recaptures} graph compilation(s) or CUDA graph recording(s) during the measured calls: the timings "
            "include compiler work (its numbers are logged; compile_recaptures says how many)"
        )


class CudaGraphsSkipped(Exception):
    """A compiled CUDA cell ran a graph without CUDA graphs: it measured kernel launches that compile removes."""


def check_cudagraphs_used(skips: int, cuda: bool) -> None:
    """`skips` from before the cold call to the end of the measured calls; CPU graphs have no CUDA graphs."""
    if skips and cuda:
        raise CudaGraphsSkipped(
            f"Inductor ran {skips} graph(s) without CUDA graphs (TORCH_LOGS=cudagraphs says why): the calls "
            "launched every kernel one by one, so they do not measure the compiled strategy (their numbers are "
            "logged; compile_cudagraph_skips says how many)"
        )


def cell_tags(runs: list[MeasuredCall], metrics: dict[str, float], bandwidth: Bandwidth) -> dict[str, Any]:
    methods = sorted({run.peak.host_method for run in runs})
    return {
        ResultTag.CACHE_CLASS: runs[-1].identity.tag,
        ResultTag.IMPLAUSIBLE: str(implausible(metrics, bandwidth)).lower(),
        ResultTag.HOST_PEAK: HWM if methods == [HWM] else "; ".join(m for m in methods if m != HWM),
    }


ANSWER_ROOM = 8  # tokens a file prompt's answer may take beyond its own length (a chat model's preamble)


def answer_budget(feed: Feed, prompts: list[Prompt]) -> int:
    """New tokens a batch of trials generates: what its longest expected answer needs."""
    answered = [p for p in prompts if p.answer is not None]
    if not answered:
        return 1
    if answered[0].kind != FILE:
        return suite_answer_budget(feed.tokenizer, answered)
    return max(len(feed.tokenizer(p.answer, add_special_tokens=False)["input_ids"]) + ANSWER_ROOM for p in answered)


@dataclass(frozen=True)
class TaskOutcome:
    metrics: dict[str, float] = field(default_factory=dict)  # accuracy, its interval, per depth; empty: no task
    trials: tuple[dict[str, Any], ...] = ()  # every prompt that has an answer: what it asked, what came back


def task_accuracy(session: GenerateSession, strategy: CacheStrategy, feed: Feed, batch: int, seed: int) -> TaskOutcome:
    """Each task's accuracy over its prompts that have an answer, with its exact 95% interval and RULER's partial
    credit beside it; passkey also per depth. A prompts file's answers are one task (`answer_accuracy`).

    Every such prompt is also kept as a trial (`task.jsonl`): its task, index and the sweep's seed rebuild it.
    A batch holds one task's prompts (each task has whole batches), so it generates what that task needs."""
    if not any(p.answer is not None for p in feed.prompts):
        return TaskOutcome()
    by_task: dict[str, list[tuple[Prompt, list[bool]]]] = defaultdict(list)
    trials: list[dict[str, Any]] = []
    index_in_task: dict[str, int] = defaultdict(int)
    for start in range(0, len(feed.prompts), batch):
        rows = feed.prompts[start : start + batch]
        ids = torch.tensor([p.ids for p in rows], dtype=torch.long)
        tokens = session.answer(strategy, ids, answer_budget(feed, rows))
        answers = feed.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        for prompt, text in zip(rows, answers, strict=True):
            index = index_in_task[prompt.kind]
            index_in_task[prompt.kind] += 1
            if prompt.answer is None:
                continue
            hits = value_hits(prompt, text)
            by_task[prompt.kind].append((prompt, hits))
            trials.append(trial_record(index, seed, prompt, text, hits))
    metrics: dict[str, float] = {Metric.TASK_TRIALS: float(sum(len(rows) for rows in by_task.values()))}
    for task, answered in by_task.items():
        metrics.update(_task_metrics(task, answered))
    return TaskOutcome(metrics, tuple(trials))


def _task_metrics(task: str, answered: list[tuple[Prompt, list[bool]]]) -> dict[str, float]:
    correct = [all(hits) for _, hits in answered]
    if task == FILE:
        return share_metrics(Metric.ANSWER_ACCURACY, correct)
    metrics = share_metrics(task_accuracy_metric(task), correct)
    metrics[task_trials_metric(task)] = float(len(answered))
    metrics[task_partial_metric(task)] = sum(sum(hits) / len(hits) for _, hits in answered) / len(answered)
    if task == PASSKEY:
        by_depth: dict[float, list[bool]] = defaultdict(list)
        for (prompt, _), ok in zip(answered, correct, strict=True):
            by_depth[float(prompt.depth or 0.0)].append(ok)
        for depth, outcomes in sorted(by_depth.items()):
            metrics[passkey_depth_metric(depth)] = sum(outcomes) / len(outcomes)
    return metrics


def trial_record(index: int, seed: int, prompt: Prompt, text: str, hits: list[bool]) -> dict[str, Any]:
    """One line of `task.jsonl`: the task, the prompt's index in it and the seed (with the cell's context and inputs
    settings they rebuild it), where the needle asked for sat, what was expected, the greedy answer as decoded,
    the verdict, and the share of expected values found."""
    return {
        "task": prompt.kind,
        "prompt_index": index,
        "seed": seed,
        "kind": prompt.kind,
        "depth": prompt.depth,
        "expected": prompt.answer,
        "answer": text,
        "correct": all(hits),
        "partial": sum(hits) / len(hits),
    }


def share_metrics(metric: str, outcomes: list[bool]) -> dict[str, float]:
    """The share of successes and its Clopper-Pearson 95% interval."""
    low, high = exact_interval(sum(outcomes), len(outcomes))
    return {metric: sum(outcomes) / len(outcomes), ci_low(metric): low, ci_high(metric): high}


@dataclass(frozen=True)
class QualityCheck:
    metrics: dict[str, float] = field(default_factory=dict)  # task accuracy, agreement, KL; empty: not measured
    forward: str = ""  # the forward the KL used: compiled | eager ("" when nothing was compared)
    not_measured: str = ""  # why there are no metrics (the `kvsweep.quality` tag)
    trials: tuple[dict[str, Any], ...] = ()  # every task trial (`task.jsonl`)


def quality_or_nothing(
    session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int, feed: Feed, seed: int
) -> QualityCheck:
    """The quality check runs after the measurement: if its extra calls do not fit (a dynamic baseline
    where only a lean cache fits is the very case), the cell keeps its numbers and says why.

    The task comes first: it runs the cell's own strategy alone, so it fits wherever the timed calls
    did, and its accuracy stays when the comparison with dynamic then runs out of memory."""
    task = TaskOutcome()
    try:
        if feed.prompts:
            task = task_accuracy(session, strategy, feed, session.cell.batch_size, seed)
        check = _quality(session, strategy, tokens, vocab)
        return QualityCheck({**task.metrics, **check.metrics}, check.forward, trials=task.trials)
    except Exception as exc:
        if not out_of_memory(exc, "cuda" if session.cuda else "cpu"):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        part = "the comparison with dynamic" if task.metrics else "the quality check"
        why = f"not measured: {part} ran out of memory ({type(exc).__name__})"
        return QualityCheck(task.metrics, not_measured=why, trials=task.trials)


def _quality(session: GenerateSession, strategy: CacheStrategy, tokens: torch.Tensor, vocab: int) -> QualityCheck:
    """Agreement with the dynamic-cache answer on the same model and inputs, and the teacher-forced KL.

    Both compare the strategy as configured (a compiled cell's compiled forward): the question is what
    serving with this cache would produce. The dynamic baseline always runs eager.
    """
    if strategy.name == BASELINE:
        return QualityCheck(token_agreement(tokens, tokens))
    dynamic = get_strategy(BASELINE)
    rows = reference_rows(tokens.shape[0], tokens.shape[1], vocab)
    with session.eager():
        baseline, reference = record_reference(lambda p: session.generate_with(dynamic, p), rows)
    if not strategy.takes_logits_processors:
        return QualityCheck(token_agreement(tokens, baseline), "eager")
    prompt_length = session.inputs.shape[1]
    compiled_before = session.compiled_calls
    kl = teacher_forced_kl(lambda p: session.generate_with(strategy, p), baseline, reference, prompt_length)
    compiled = session.compiled_calls > compiled_before or (session.cell.compile and session.cuda)
    return QualityCheck({**token_agreement(tokens, baseline), **kl}, "compiled" if compiled else "eager")
