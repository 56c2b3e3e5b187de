"""What each model is fed is decided before Ray starts: auto falls back with a reason, mistakes are one line.

The model folder here is real: a one-layer Llama with random weights and a word-level tokenizer
built from a few sentences, both saved with `save_pretrained` the way a user's checkpoint is.
"""

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsweep.cli import main
from kvsweep.config.compose import compose_config
from kvsweep.driver.inputs_choice import choose_inputs
from kvsweep.errors import ConfigError
from kvsweep.inputs.prompt_file import read_prompt_file
from kvsweep.inputs.tasks.base import TaskKit
from kvsweep.inputs.tasks.suite import get_task
from kvsweep.models.resolve import classify, load_tokenizer, tokenizer_problem

SENTENCES = ["the pass key is hidden in the text", "what is the pass key", "remember it"]
PRESET_REASON = "a bundled preset has random weights and no tokenizer"


def _save_tiny_llama(folder: Path, with_tokenizer: bool) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tokenizer),
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    if with_tokenizer:
        tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> str:
    return str(_save_tiny_llama(tmp_path_factory.mktemp("models") / "word-llama", with_tokenizer=True))


@pytest.fixture(scope="module")
def tokenizerless_folder(tmp_path_factory) -> str:
    return str(_save_tiny_llama(tmp_path_factory.mktemp("models") / "weights-only", with_tokenizer=False))


def config(*overrides: str):
    return compose_config(list(overrides)).config


# --- the prompts file -------------------------------------------------------------------------------------

JSONL = (
    '{"prompt": "Total due?", "answer": "$1,240.00"}\n'
    "\n"
    '{"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "6 times 7?"}], '
    '"answer": 42}\n'
    '{"prompt": "Pi to two places?", "answer": 3.10}\n'
    '{"prompt": "No answer here."}\n'
)


def test_jsonl_records_are_read_with_their_line_numbers(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(JSONL)
    read = read_prompt_file(str(path))
    assert read.name == "prompts.jsonl"
    assert read.sha256 == hashlib.sha256(JSONL.encode()).hexdigest()
    assert read.records == (
        {"prompt": "Total due?", "answer": "$1,240.00", "line": 1},
        {
            "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "6 times 7?"}],
            "answer": "42",
            "line": 3,
        },
        {"prompt": "Pi to two places?", "answer": "3.10", "line": 4},  # as written, not float 3.1
        {"prompt": "No answer here.", "line": 5},
    )


def test_txt_blocks_are_prompts_with_their_first_line(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("\nFirst prompt,\nwith a second line.\n\n\n   \nSecond prompt.\r\n\r\nThird\n  indented\n")
    assert read_prompt_file(str(path)).records == (
        {"prompt": "First prompt,\nwith a second line.", "line": 2},
        {"prompt": "Second prompt.", "line": 7},
        {"prompt": "Third\n  indented", "line": 9},
    )


BAD_FILES = [
    # (file name, contents, what the one line must say)
    ("prompts.csv", "a,b\n", ["prompts.csv: expected a .jsonl or .txt file"]),
    ("prompts.jsonl", "", ["prompts.jsonl has no prompts", "empty"]),
    ("prompts.txt", "\n  \n\n", ["prompts.txt has no prompts", "blank"]),
    ("prompts.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"\n', ["prompts.jsonl line 3 is not JSON"]),
    ("prompts.jsonl", '\n\n["a list"]\n', ["line 3 is a JSON list", "object"]),
    ("prompts.jsonl", '{"prompt": "a"}\n{"answer": "b"}\n', ["line 2 has neither 'prompt' nor 'messages'"]),
    (
        "prompts.jsonl",
        '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}\n',
        ["line 1 has both 'prompt' and 'messages'"],
    ),
    ("prompts.jsonl", '{"promt": "a"}\n', ["line 1 has unknown key 'promt'", "allowed: prompt, messages, answer"]),
    ("prompts.jsonl", '{"prompt": 7}\n', ["line 1: 'prompt' must be a string", "number"]),
    ("prompts.jsonl", '{"prompt": "  "}\n', ["line 1: 'prompt' is empty"]),
    ("prompts.jsonl", '{"messages": []}\n', ["line 1: 'messages' must be a non-empty list"]),
    ("prompts.jsonl", '{"messages": [{"role": "user"}]}\n', ["line 1: messages[0]", "'role' and 'content'"]),
    (
        "prompts.jsonl",
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n',
        ["line 1: the last of 'messages' is a 'assistant' turn", "'user'"],
    ),
    ("prompts.jsonl", '{"prompt": "a", "answer": null}\n', ["line 1: 'answer' must be a string or a number", "null"]),
    ("prompts.jsonl", '{"prompt": "a", "answer": true}\n', ["line 1: 'answer' must be", "boolean"]),
]


@pytest.mark.parametrize(("name", "contents", "says"), BAD_FILES)
def test_a_bad_prompts_file_is_one_line_naming_it(tmp_path, name, contents, says):
    (tmp_path / name).write_text(contents)
    with pytest.raises(ConfigError) as raised:
        read_prompt_file(str(tmp_path / name))
    message = str(raised.value)
    assert "\n" not in message and message.startswith("inputs.path: "), message
    for part in says:
        assert part in message, message


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    (tmp_path / "prompts.txt").write_bytes(b"fine\n\ncaf\xe9\n")
    with pytest.raises(ConfigError, match=r"prompts\.txt line 3 is not UTF-8"):
        read_prompt_file(str(tmp_path / "prompts.txt"))


def test_missing_file_and_folder_are_named_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError, match=r"^inputs\.path: nope\.jsonl does not exist") as raised:
        read_prompt_file("nope.jsonl")
    assert str(tmp_path) in str(raised.value)  # where a relative path was looked for
    with pytest.raises(ConfigError, match=r"^inputs\.path: data is a folder"):
        read_prompt_file("data")


# --- the tokenizer ----------------------------------------------------------------------------------------


def test_the_tokenizer_loads_from_the_model_folder(llama_folder, tokenizerless_folder):
    ref = classify(llama_folder)
    assert tokenizer_problem(ref, trust_remote_code=False) is None
    tokenizer = load_tokenizer(ref, trust_remote_code=False)
    ids = tokenizer("the pass key", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["the", "pass", "key"]
    assert tokenizer_problem(classify("tiny-llama"), trust_remote_code=False) == PRESET_REASON
    assert "no tokenizer files" in tokenizer_problem(classify(tokenizerless_folder), trust_remote_code=False)


# --- the choice -------------------------------------------------------------------------------------------


def test_auto_feeds_the_task_suite_where_a_tokenizer_loads_and_random_elsewhere(llama_folder):
    choice = choose_inputs(config(f"grid.models=[{llama_folder},tiny-llama]"))
    assert choice.by_model == {llama_folder: "tasks", "tiny-llama": "random"}
    assert choice.reasons == {
        llama_folder: f"tasks: auto, its tokenizer loads from {llama_folder}",
        "tiny-llama": f"random: auto, {PRESET_REASON}",
    }
    assert choice.lines() == [
        "inputs: tasks for word-llama (auto: its tokenizer loads; passkey, niah_single, niah_multikey, vt)",
        f"inputs: random for tiny-llama (auto: {PRESET_REASON})",
    ]
    assert choice.spec.depths == (0.1, 0.5, 0.9) and choice.spec.quality_trials == 16 and not choice.spec.records
    assert choice.spec.tasks == ("passkey", "niah_single", "niah_multikey", "vt")


def test_source_passkey_runs_the_single_key_task_alone_and_keeps_its_cell_ids(llama_folder):
    """`inputs.source=passkey` is the task it always was: no suite in the inputs, so its cells' ids are unchanged."""
    choice = choose_inputs(config(f"grid.models=[{llama_folder}]", "inputs.source=passkey"))
    assert choice.by_model == {llama_folder: "passkey"} and choice.spec.tasks == ()
    assert "tasks" not in choice.spec.identity()


def test_auto_falls_back_to_random_when_the_tokenizer_fails(tokenizerless_folder):
    choice = choose_inputs(config(f"grid.models=[{tokenizerless_folder}]", "measure.quality_trials=4"))
    assert choice.by_model == {tokenizerless_folder: "random"}
    assert choice.reasons[tokenizerless_folder].startswith("random: auto, the tokenizer could not be loaded (")
    assert choice.spec.quality_trials == 4


def test_source_random_feeds_every_model_random_ids(llama_folder):
    choice = choose_inputs(config(f"grid.models=[{llama_folder},tiny-llama]", "inputs.source=random"))
    assert choice.by_model == {llama_folder: "random", "tiny-llama": "random"}
    assert set(choice.reasons.values()) == {"random: inputs.source=random"}


def test_source_file_reads_the_prompts_once_for_every_model(llama_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("prompts.jsonl").write_text(JSONL)
    choice = choose_inputs(config(f"grid.models=[{llama_folder}]", "inputs.source=file", "inputs.path=prompts.jsonl"))
    assert choice.by_model == {llama_folder: "file:prompts.jsonl"}
    assert choice.reasons == {llama_folder: "file: inputs.source=file"}
    assert choice.spec.file_name == "prompts.jsonl"
    assert choice.spec.file_sha256 == hashlib.sha256(JSONL.encode()).hexdigest()
    assert [r["line"] for r in choice.spec.records] == [1, 3, 4, 5]
    assert choice.lines() == ["inputs: file:prompts.jsonl for word-llama (inputs.source=file, 4 prompts)"]


def test_passkey_for_a_preset_is_refused_naming_the_model():
    with pytest.raises(ConfigError) as raised:
        choose_inputs(config("grid.models=[tiny-llama]", "inputs.source=passkey"))
    assert str(raised.value) == (
        f"inputs.source=passkey needs a tokenizer; grid.models[0] 'tiny-llama': {PRESET_REASON}; "
        "use inputs.source=random or auto"
    )


def test_file_for_a_model_without_tokenizer_names_its_index(llama_folder, tokenizerless_folder, tmp_path):
    (tmp_path / "p.txt").write_text("Hello there.\n")
    models = f"grid.models=[{llama_folder},{tokenizerless_folder}]"
    with pytest.raises(ConfigError) as raised:
        choose_inputs(config(models, "inputs.source=file", f"inputs.path={tmp_path}/p.txt"))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("inputs.source=file needs a tokenizer; grid.models[1] ")
    assert "grid.models[0]" not in message and "no tokenizer files" in message


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["inputs.path=prompts.jsonl"], ["inputs.path is set", "inputs.source=file"]),
        (["inputs.source=passkey", "inputs.path=prompts.jsonl"], ["inputs.path is set", "inputs.source=passkey"]),
        (["inputs.source=file"], ["inputs.source=file needs inputs.path"]),
        (["inputs.source=prose"], ["inputs.source: unknown source 'prose'", "auto, random, tasks, passkey, file"]),
        (["inputs.tasks=[niah_single,ruler_qa]"], ["inputs.tasks: unknown task 'ruler_qa'", "niah_multikey"]),
        (["inputs.tasks=[]"], ["inputs.tasks is empty"]),
        (["inputs.tasks=[vt]"], ["inputs.tasks needs a tokenizer", "grid.models[0] 'tiny-llama'"]),
        (["inputs.source=tasks"], ["inputs.source=tasks needs a tokenizer"]),
        (
            ["inputs.source=file", "inputs.path=p.jsonl", "inputs.tasks=[vt]"],
            ["inputs.tasks is set (vt) but inputs.source=file runs the file's own prompts"],
        ),
        (["inputs.source=random", "inputs.tasks=[cwe]"], ["inputs.tasks is set (cwe) but inputs.source=random"]),
        (["inputs.depths=[]"], ["inputs.depths is empty"]),
        (["inputs.source=file", "inputs.path=missing.jsonl"], ["inputs.path: missing.jsonl does not exist"]),
    ],
)
def test_bad_inputs_settings_are_one_line(overrides, says):
    with pytest.raises(ConfigError) as raised:
        choose_inputs(config("grid.models=[tiny-llama]", *overrides))
    message = str(raised.value)
    assert "\n" not in message, message
    for part in says:
        assert part in message, message


def test_a_bad_prompts_line_stops_the_run_with_exit_2(tmp_path, capsys):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    overrides = ["inputs.source=file", f"inputs.path={tmp_path}/prompts.jsonl", f"hydra.run.dir={tmp_path}/run"]
    assert main(["grid.models=[tiny-llama]", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "prompts.jsonl line 2 is not JSON" in err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_a_preset_only_driver_imports_no_transformers(llama_folder):
    """Choosing inputs for presets (or with source=random) loads no tokenizer: the driver stays fast."""
    script = (
        "import sys, json\n"
        "from kvsweep.config.compose import compose_config\n"
        "from kvsweep.driver.inputs_choice import choose_inputs\n"
        "for o in sys.argv[1:]:\n"
        "    choose_inputs(compose_config(json.loads(o)).config)\n"
        "print('transformers' in sys.modules, 'torch' in sys.modules)\n"
    )
    sweeps = [["grid.models=[tiny-llama,smollm2-135m]"], [f"grid.models=[{llama_folder}]", "inputs.source=random"]]
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(json.dumps, sweeps)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_passkey_for_the_default_preset_exits_2_before_ray(tmp_path):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kvsweep", "inputs.source=passkey", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "inputs.source=passkey needs a tokenizer; grid.models[0]" in lines[0]
    assert PRESET_REASON in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()
    assert time.monotonic() - started < 20


def test_a_task_longer_than_a_context_of_the_grid_is_refused_naming_both(llama_folder):
    """The suite's minimum is worked out in the model's own tokens: at 64 tokens multi-query's four needles, its
    question and the least haystack do not fit, and the line says how many tokens it needs."""
    tokenizer = load_tokenizer(classify(llama_folder), trust_remote_code=False)
    least = TaskKit(tokenizer, True)
    needed = get_task("niah_multiquery").minimum_context(least)
    assert needed > 64
    with pytest.raises(ConfigError) as raised:
        choose_inputs(
            config(f"grid.models=[{llama_folder}]", "inputs.tasks=[niah_multiquery]", "grid.context_lengths=[64,4096]")
        )
    assert str(raised.value) == (
        f"inputs.tasks: niah_multiquery needs at least {needed} tokens with grid.models[0] {llama_folder!r}'s "
        "tokenizer, but grid.context_lengths has 64; drop niah_multiquery or that context"
    )
    fits = choose_inputs(
        config(f"grid.models=[{llama_folder}]", "inputs.tasks=[niah_multiquery]", f"grid.context_lengths=[{needed}]")
    )
    assert fits.by_model == {llama_folder: "tasks"} and fits.spec.tasks == ("niah_multiquery",)


def test_an_unknown_task_stops_the_run_with_exit_2_before_anything_starts(tmp_path, capsys):
    assert main(["grid.models=[tiny-llama]", "inputs.tasks=[niah_single,needle]", f"hydra.run.dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "inputs.tasks: unknown task 'needle'" in err, err
    assert not (tmp_path / "run").exists()


def test_a_hub_checkpoint_the_driver_cannot_reach_is_planned_from_the_preset_of_its_shapes():
    """With no Hub here (the tests set HF_HUB_OFFLINE), a checkpoint whose shapes a bundled preset has is planned
    from the preset (its KV bytes are the preset's to the byte) and still fed the suite, which its cells fetch;
    one no preset stands for falls back to random ids, with the reason."""
    from kvsweep.plan.sweep_plan import model_facts

    choice = choose_inputs(config("grid.models=[Qwen/Qwen2.5-7B-Instruct,org/no-such-model]"))
    assert choice.by_model == {"Qwen/Qwen2.5-7B-Instruct": "tasks", "org/no-such-model": "random"}
    assert "the plan reads the bundled preset qwen2.5-7b's shapes" in choice.lines()[0]
    facts, problems = model_facts(["Qwen/Qwen2.5-7B-Instruct", "org/no-such-model", "qwen2.5-7b"], False)
    assert facts["Qwen/Qwen2.5-7B-Instruct"].stand_in == "qwen2.5-7b"
    assert facts["Qwen/Qwen2.5-7B-Instruct"].shape == facts["qwen2.5-7b"].shape
    assert "org/no-such-model" in problems and "org/no-such-model" not in facts


def test_the_suite_is_in_the_id_of_a_cell_that_runs_it_and_of_no_other():
    """Naming other tasks measures the suite's cells anew; a cell fed random ids or the passkey keeps its id."""
    from dataclasses import replace

    from kvsweep.grid import Cell, MeasureProtocol, cell_id
    from kvsweep.inputs.spec import InputSpec

    def ids(tasks: tuple[str, ...]) -> dict[str, str]:
        protocol = MeasureProtocol(
            config("measure=quick").measure, "cpu", InputSpec((0.5,), True, 16, tasks=tasks), 1, None
        )
        cell = Cell("org/m", "float32", 1024, 1, 8, "dynamic", False)
        return {fed: cell_id(replace(cell, inputs=fed), protocol) for fed in ("tasks", "passkey", "random")}

    default, other = ids(("passkey", "niah_single")), ids(("passkey", "vt"))
    assert default["tasks"] != other["tasks"]
    assert default["passkey"] == other["passkey"] == ids(())["passkey"]
    assert default["random"] == other["random"] == ids(())["random"]
