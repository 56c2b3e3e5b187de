"""Quality numbers that can fail: a small Llama trained to find a pass key (tests/fixtures/passkey-llama).

`scripts/train_passkey_model.py` made it, seeded, on this kind of CPU: a 2-layer Llama with a
byte-level BPE tokenizer that solves kvsweep's own passkey prompts. Through the real cell path and
`python -m kvsweep`: dynamic finds the keys, a 1-bit HQQ cache (registered here, destructive by
construction) loses them with intervals apart and is refused, int8 keeps them; and a prompts file's
exact-match accuracy is the share counted by hand.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import cell_runs
from kvsweep.caches import get_strategy, registered
from kvsweep.inputs.prompts import build_prompts
from kvsweep.inputs.spec import PASSKEY, InputSpec

FIXTURE = Path(__file__).parent / "fixtures" / "passkey-llama"
CONTEXT = 384  # within the lengths it was trained on
HQQ_INT1 = dataclasses.replace(get_strategy("quantized-hqq-int2"), name="quantized-hqq-int1", nbits=1)
SPEC = InputSpec(depths=(0.1, 0.5, 0.9), chat_template=True, quality_trials=16)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIXTURE)


def test_the_fixture_is_small_and_its_tokenizer_is_what_the_task_needs(tokenizer):
    assert sum(f.stat().st_size for f in FIXTURE.iterdir()) < 4 * 2**20
    assert [tokenizer.decode([t]) for t in tokenizer("58213", add_special_tokens=False)["input_ids"]] == list("58213")
    assert tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id
    assert tokenizer.bos_token_id not in tokenizer("a", add_special_tokens=False)["input_ids"]
    assert not getattr(tokenizer, "chat_template", None)


def _metrics(tracking_uri: str) -> dict[str, tuple[dict, dict, dict]]:
    _, children = cell_runs(tracking_uri)
    return {r.data.params["cache"]: (r.data.metrics, r.data.tags, r.data.params) for r in children}


@pytest.mark.slow
def test_a_destructive_cache_loses_the_task_and_is_refused_while_int8_keeps_it(run_sweep):
    caches = "dynamic,quantized-hqq-int8,quantized-hqq-int1"
    with registered(HQQ_INT1):
        grid = (f"grid.models=[{FIXTURE}]", f"grid.context_lengths=[{CONTEXT}]", f"grid.caches=[{caches}]")
        run = run_sweep(*grid, "inputs.source=passkey")  # a model trained for this one task: the suite alone
    assert run.code == 0, run.out + run.err
    assert "inputs: passkey for passkey-llama (inputs.source=passkey)" in run.out
    cells = _metrics(run.tracking_uri)
    dynamic, int8, int1 = (cells[c][0] for c in caches.split(","))
    assert {cells[c][2]["inputs"] for c in cells} == {"passkey"}
    assert len({cells[c][2]["inputs_sha256"] for c in cells}) == 1  # every strategy answered the same prompts
    assert dynamic["task_trials"] == 16 and dynamic["passkey_accuracy"] >= 0.9  # the task is real
    assert int1["passkey_accuracy_ci_high"] < dynamic["passkey_accuracy_ci_low"]  # measurably lower
    assert int1["kl_divergence"] > 10 * int8["kl_divergence"]
    assert dynamic["passkey_accuracy"] - int8["passkey_accuracy"] <= 0.05
    assert cells["quantized-hqq-int1"][1]["kvsweep.quality_loss"] == "true"
    assert cells["quantized-hqq-int8"][1]["kvsweep.quality_loss"] == "false"
    [line] = [x for x in run.out.splitlines() if f"ctx{CONTEXT}" in x and "refused" in x]
    assert "quantized-hqq-int1 (passkey " in line and f"at ctx {CONTEXT}" in line
    assert "fastest quantized-hqq-int1" not in line and "leanest within 10%: quantized-hqq-int1" not in line


@pytest.mark.slow
def test_a_prompts_files_accuracy_is_the_hand_count(run_sweep, tokenizer, tmp_path):
    """Ten passkey prompts as a user's file: six carry their true key as the answer, four a wrong one."""
    prompts = build_prompts(tokenizer, PASSKEY, 10, CONTEXT - 16, 5, SPEC)
    records = []
    for i, prompt in enumerate(prompts):
        text = tokenizer.decode(list(prompt.ids), skip_special_tokens=True)
        answer = prompt.answer if i < 6 else str(int(prompt.answer) + 1)
        records.append({"prompt": text, "answer": answer})
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = run_sweep(
        f"grid.models=[{FIXTURE}]",
        f"grid.context_lengths=[{CONTEXT}]",
        "grid.caches=[dynamic]",
        "inputs.source=file",
        f"inputs.path={path}",
        "measure.quality_trials=10",
    )
    assert run.code == 0, run.out + run.err
    [(metrics, _, params)] = _metrics(run.tracking_uri).values()
    assert params["inputs"] == "file:prompts.jsonl"
    assert metrics["task_trials"] == 10 and metrics["answer_accuracy"] == pytest.approx(6 / 10)
    # task.jsonl keeps every trial: a hand reading of its stored answers gives the same count
    from mlflow import MlflowClient

    [run_info] = cell_runs(run.tracking_uri)[1]
    stored = Path(MlflowClient(run.tracking_uri).download_artifacts(run_info.info.run_id, "task.jsonl"))
    trials = [json.loads(line) for line in stored.read_text().splitlines()]
    assert [t["expected"] for t in trials] == [r["answer"] for r in records]
    by_hand = [t["answer"].strip().split(".")[0].strip() == t["expected"] for t in trials]
    assert [t["correct"] for t in trials] == by_hand and sum(by_hand) == 6
