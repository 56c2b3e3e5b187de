"""A workload of the user's own prompts (`workload.source=file`) on the real pretrained model, as a user runs it.

The expectations are worked out here, apart from kvsweep: each request's length is what the model's own tokenizer
(loaded by Transformers in the test) makes of the prompt, and the accuracy is recounted from the answers the cells
kept, with a plain comparison written in the test.
"""

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from mlflow import MlflowClient

from conftest import cell_runs
from kvsweep.cli import main
from kvsweep.names import TASK_JSONL, Metric
from kvsweep.tracking.journal import Journal

# Few-shot questions a 135M model can often answer in one word after "A:"; the sweep runs without the chat
# template, so a request's prompt is the text as written (after the tokenizer's leading specials, if any).
QUESTIONS = [
    ("Q: What is the capital of Italy?\nA: Rome\n\nQ: What is the capital of Germany?\nA:", "Berlin"),
    ("Q: What colour is grass?\nA: Green\n\nQ: What colour is the sky on a clear day?\nA:", "Blue"),
    ("Q: What is the opposite of hot?\nA: Cold\n\nQ: What is the opposite of up?\nA:", "Down"),
    ("Q: What is 1 + 1?\nA: 2\n\nQ: What is 2 + 3?\nA:", "5"),
]
OUTPUT_TOKENS = 4
OUTPUT = f"workload.output_lengths=fixed:{OUTPUT_TOKENS}"

pytestmark = pytest.mark.slow


def kvsweep(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def prompts_file(folder: Path, rows: list[dict]) -> Path:
    path = folder / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_prompts_file_is_replayed_at_its_own_lengths_and_its_answers_scored_per_cache(
    real_model, ray_cluster, cell_template, migrated_store, tmp_path
):
    from transformers import AutoTokenizer

    path = prompts_file(tmp_path, [{"prompt": p, "answer": a} for p, a in QUESTIONS])
    shutil.copyfile(migrated_store, tmp_path / "mlflow.db")
    store, run_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    code, out, err = kvsweep(
        f"grid.models=[{real_model}]",
        "grid.dtypes=[float32]",
        "grid.caches=[dynamic,quantized-fp8]",
        "measure.threads=1",
        "workload.source=file",
        f"workload.path={path}",
        f"workload.output_lengths=fixed:{OUTPUT_TOKENS}",
        "workload.warmup_requests=1",
        "workload.name=questions",
        "inputs.chat_template=false",
        f"mlflow.tracking_uri={store}",
        f"hydra.run.dir={run_dir}",
    )
    assert code == 0, out + err
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    lengths = [len(tokenizer(p)["input_ids"]) for p, _ in QUESTIONS]  # the text with the tokenizer's specials
    results = {r.cell.cache: r for r in Journal(run_dir).read().results}
    assert set(results) == {"dynamic", "quantized-fp8"}
    for cache, result in results.items():
        assert result.status == "ok", (cache, result.error)
        requests = result.samples["requests"]
        assert [(r["input_tokens"], r["output_tokens"]) for r in requests] == [(n, OUTPUT_TOKENS) for n in lengths]
        assert result.cell.context_length == max(lengths)  # planned at the longest prompt the tokenizer made
        assert result.cell.inputs == "file:questions.jsonl"
        # the accuracy recounted from what each request generated, decoded and compared here
        said = [tokenizer.decode(r["tokens"], skip_special_tokens=True) for r in requests]
        right = [first_word(text) == answer.casefold() for text, (_, answer) in zip(said, QUESTIONS, strict=True)]
        assert result.metrics[Metric.ANSWER_ACCURACY] == pytest.approx(sum(right) / len(right))
        assert result.metrics[Metric.TASK_TRIALS] == len(QUESTIONS)
        assert [t["answer"] for t in result.trials] == said  # every answer kept, in the mix's order
    # MLflow: each cell's accuracy is a metric and its answers are its task.jsonl
    _, children = cell_runs(store)
    client = MlflowClient(tracking_uri=store)
    for child in children:
        result = results[child.data.params["cache"]]
        assert child.data.metrics[Metric.ANSWER_ACCURACY] == result.metrics[Metric.ANSWER_ACCURACY]
        kept = Path(client.download_artifacts(child.info.run_id, TASK_JSONL, str(tmp_path / child.info.run_id)))
        assert [json.loads(line)["answer"] for line in kept.read_text().splitlines()] == [
            t["answer"] for t in result.trials
        ]
    assert "questions sequential bs1" in out


def first_word(text: str) -> str:
    """The first line's text without its spaces and a full stop, case-folded: " Berlin\n\nQ" is "berlin"."""
    return (text.strip().splitlines() or [""])[0].strip(" .").casefold()


@pytest.mark.parametrize(
    ("rows", "overrides", "says"),
    [
        ([{"prompt": "Hi", "answer": 3.5}, {"prompt": 7}], [OUTPUT], "line 2: 'prompt' must be a string"),
        ([{"prompt": "Hi"}], [], "needs workload.output_lengths"),
        ([{"prompt": "word " * 9000}], [OUTPUT], "line 1: a prompt of"),  # past SmolLM2's 8,192 positions
    ],
)
def test_a_bad_prompts_file_workload_is_one_line_and_exit_2(real_model, rows, overrides, says, tmp_path):
    path = prompts_file(tmp_path, rows)
    code, _, err = kvsweep(
        f"grid.models=[{real_model}]",
        "workload.source=file",
        f"workload.path={path}",
        *overrides,
        "dry_run=true",
        f"hydra.run.dir={tmp_path}/run",
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and "workload" in err, err


def test_a_model_without_a_tokenizer_cannot_replay_a_prompts_file(tmp_path):
    """A bundled preset has random weights and no tokenizer: its requests would have no length. One line, exit 2."""
    path = prompts_file(tmp_path, [{"prompt": "Hi"}])
    code, _, err = kvsweep(
        "grid.models=[tiny-llama]", "workload.source=file", f"workload.path={path}", OUTPUT, "dry_run=true"
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "tiny-llama has no tokenizer" in err and "questions.jsonl" in err


def test_a_node_whose_tokenizer_encodes_a_prompt_otherwise_refuses_to_replay_it(real_model):
    """The cell re-encodes the prompts; lengths other than the driver planned would be other requests."""
    from transformers import AutoTokenizer

    from kvsweep.cell.workload_text import TokenizerMismatch, encode_requests
    from kvsweep.workload.workload_spec import WorkloadPrompts

    tokenizer = AutoTokenizer.from_pretrained(real_model)
    records = tuple({"prompt": p, "answer": a, "line": i + 1} for i, (p, a) in enumerate(QUESTIONS))
    prompts = WorkloadPrompts("questions.jsonl", "0" * 64, records, chat_template=False)
    lengths = tuple(len(tokenizer(p)["input_ids"]) for p, _ in QUESTIONS)
    assert [len(p.ids) for p in encode_requests(prompts, tokenizer, lengths)] == list(lengths)
    planned = (*lengths[:2], lengths[2] + 1, lengths[3])
    with pytest.raises(TokenizerMismatch, match=r"questions\.jsonl line 3: this node.s tokenizer encodes"):
        encode_requests(prompts, tokenizer, planned)
