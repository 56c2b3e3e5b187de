"""Text prompts are exactly the cell's context length, hide the key where asked, and keep the question.

The tokenizers are real: a byte-level BPE trained here on a slice of the filler, with a BOS added by
its post-processor the way Llama's is, and a copy of it with a chat template.
"""

import os
import re
import subprocess
import sys

import pytest

from kvsweep.inputs.filler import FORBIDDEN_WORDS, paragraph
from kvsweep.inputs.passkey import ANSWER_LEAD, INTRO, QUESTION, exact_match, key_found
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.prompts import build_prompts, minimum_context, prompts_sha256
from kvsweep.inputs.scoring import answer_correct
from kvsweep.inputs.spec import FILE, PASSKEY, PROMPTS_VERSION, InputSpec

PASSKEY_SPEC = InputSpec(depths=(0.1, 0.5, 0.9), chat_template=True, quality_trials=16)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _tokenizer(chat_template: str | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([*(" ".join(paragraph(i)) for i in range(300)), INTRO, QUESTION], trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.fixture(scope="module")
def plain():
    return _tokenizer()


@pytest.fixture(scope="module")
def chat():
    return _tokenizer(CHAT_TEMPLATE)


def _text(tokenizer, prompt: Prompt) -> str:
    return tokenizer.decode(list(prompt.ids), skip_special_tokens=True)


def _file_spec(*records: dict, chat_template: bool = True) -> InputSpec:
    lines = tuple({**r, "line": i + 1} for i, r in enumerate(records))
    return InputSpec((0.5,), chat_template, 16, file_name="p.jsonl", file_sha256="x", records=lines)


# --- passkey -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("context", [160, 384, 1500])
def test_every_passkey_prompt_is_exactly_the_context_and_hides_its_own_key(plain, context):
    prompts = build_prompts(plain, PASSKEY, 6, context, 0, PASSKEY_SPEC)
    assert [len(p.ids) for p in prompts] == [context] * 6
    for prompt in prompts:
        text = _text(plain, prompt)
        assert re.fullmatch(r"[1-9]\d{4,6}", prompt.answer)
        needle = f"The pass key is {prompt.answer}. Remember it. {prompt.answer} is the pass key."
        before, found, after = text.partition(needle)
        assert found
        # between sentences: after the intro's or a sentence's full stop, before a new sentence or the question
        assert before.endswith((". ", "\n\n")), before[-40:]
        assert re.match(r"( [A-Z]|\n\n)", after), after[:40]
        assert text.startswith(INTRO) and text.endswith(QUESTION + " " + ANSWER_LEAD)
        assert prompt.ids[0] == plain.bos_token_id and plain.eos_token_id not in prompt.ids


def test_the_needle_sits_at_its_depth_of_the_filler(plain):
    context = 2000
    prompts = build_prompts(plain, PASSKEY, 9, context, 3, PASSKEY_SPEC)
    assert [p.depth for p in prompts] == [0.1, 0.5, 0.9] * 3
    intro = len(plain(INTRO, add_special_tokens=False)["input_ids"])
    question = len(plain("\n\n" + QUESTION + " " + ANSWER_LEAD, add_special_tokens=False)["input_ids"])
    for prompt in prompts:
        needle = plain(f" The pass key is {prompt.answer}.", add_special_tokens=False)["input_ids"]
        ids = list(prompt.ids)
        at = next(i for i in range(len(ids)) if ids[i : i + 3] == needle[:3])
        filler_tokens = context - 1 - intro - question - 30  # BOS, pieces, and about the needle's length
        share = (at - 1 - intro) / filler_tokens
        assert abs(share - prompt.depth) < 0.03, (prompt.depth, share)  # the nearest sentence boundary


def test_rows_differ_and_every_strategy_gets_the_same_prompts(plain):
    first = build_prompts(plain, PASSKEY, 8, 512, 0, PASSKEY_SPEC)
    again = build_prompts(plain, PASSKEY, 8, 512, 0, PASSKEY_SPEC)
    assert first == again and prompts_sha256(first) == prompts_sha256(again)
    assert len({p.ids for p in first}) == 8 and len({p.answer for p in first}) == 8
    other_seed = build_prompts(plain, PASSKEY, 8, 512, 1, PASSKEY_SPEC)
    assert prompts_sha256(other_seed) != prompts_sha256(first)
    # A longer batch starts with the same rows: batch 2's prompts are batch 8's first two.
    assert build_prompts(plain, PASSKEY, 2, 512, 0, PASSKEY_SPEC) == first[:2]


def test_the_filler_is_varied_prose_not_one_sentence_repeated(plain):
    (prompt,) = build_prompts(plain, PASSKEY, 1, 4000, 0, PASSKEY_SPEC)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", _text(plain, prompt)) if len(s.strip()) > 20]
    assert len(sentences) > 60
    assert len(set(sentences)) / len(sentences) > 0.9


def test_the_filler_holds_nothing_a_model_could_take_for_the_key_or_the_question():
    """No digit anywhere, and none of the words of the question's subject (pass, key, code, secret...)."""
    text = " ".join(" ".join(paragraph(i)) for i in range(5000))
    assert not re.search(r"\d", text)
    words = set(re.findall(r"[a-z]+", text.lower()))
    assert not words & FORBIDDEN_WORDS
    assert {"pass", "key", "code", "password"} <= FORBIDDEN_WORDS  # the list itself names the subject
    assert len(words) > 400  # varied: hundreds of distinct words


def test_the_filler_is_the_same_in_every_process():
    """Paragraph n follows from n alone: another interpreter with another hash seed writes the same text, so
    every node of a cluster builds the same prompts."""
    code = "from kvsweep.inputs.filler import paragraph; print(' '.join(' '.join(paragraph(i)) for i in (0, 7, 99)))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert other.stdout.strip() == " ".join(" ".join(paragraph(i)) for i in (0, 7, 99))


def test_a_chat_template_frames_the_prompt_and_ends_with_the_assistant_turn(chat):
    (prompt,) = build_prompts(chat, PASSKEY, 1, 600, 0, PASSKEY_SPEC)
    text = chat.decode(list(prompt.ids))
    assert len(prompt.ids) == 600
    assert text.startswith("<s><|user|>\n" + INTRO)
    assert text.endswith(QUESTION + "<|end|>\n<|assistant|>\n" + ANSWER_LEAD)  # the reply opens with the lead
    off = InputSpec((0.5,), False, 16)
    (plain_prompt,) = build_prompts(chat, PASSKEY, 1, 600, 0, off)
    assert "<|user|>" not in chat.decode(list(plain_prompt.ids))


def test_minimum_context_is_the_shortest_that_fits(plain):
    shortest = minimum_context(plain, PASSKEY, PASSKEY_SPEC)
    fixed = (
        1
        + len(plain(INTRO, add_special_tokens=False)["input_ids"])
        + len(
            plain(" The pass key is 9999999. Remember it. 9999999 is the pass key.", add_special_tokens=False)[
                "input_ids"
            ]
        )
        + len(plain("\n\n" + QUESTION, add_special_tokens=False)["input_ids"])
        + len(plain(" " + ANSWER_LEAD, add_special_tokens=False)["input_ids"])
    )
    assert shortest == fixed
    assert all(len(p.ids) == shortest for p in build_prompts(plain, PASSKEY, 16, shortest, 0, PASSKEY_SPEC))


# --- the user's prompts ------------------------------------------------------------------------------------


def test_a_long_file_prompt_is_cut_in_the_middle_of_its_body_never_at_the_question(plain):
    body = " ".join(f"Line {i} of the report says the total is {i * 7}." for i in range(400))
    question = "\n\nWhat was the total on line 3?"
    spec = _file_spec({"prompt": body + question, "answer": "21"})
    (prompt,) = build_prompts(plain, FILE, 1, 300, 0, spec)
    text = _text(plain, prompt)
    assert len(prompt.ids) == 300 and prompt.answer == "21" and prompt.depth is None
    assert text.startswith("Line 0 of the report") and text.endswith(question)
    assert "Line 399 of the report" in text and "Line 200 of the report" not in text


def test_a_short_file_prompt_is_filled_with_the_further_prompts_then_filler(plain):
    spec = _file_spec(
        {"prompt": "The invoice says 1,240 dollars.\n\nWhat is due?", "answer": "1,240 dollars"},
        {"prompt": "Second prompt of the file."},
        {"messages": [{"role": "user", "content": "Third prompt, a chat turn."}]},
    )
    prompts = build_prompts(plain, FILE, 5, 400, 0, spec)
    assert [len(p.ids) for p in prompts] == [400] * 5
    first = _text(plain, prompts[0])
    assert first.index("Second prompt of the file.") < first.index("Third prompt, a chat turn.")
    assert first.endswith("The invoice says 1,240 dollars.\n\nWhat is due?")
    filler_start = first.index("Third prompt, a chat turn.") + len("Third prompt, a chat turn.")
    assert len(first[filler_start:]) > 500  # the rest before the prompt is filler prose
    # More rows than records: the repeats shape the batch but are not counted again.
    assert [p.answer for p in prompts] == ["1,240 dollars", None, None, None, None]


def test_file_messages_keep_the_earlier_turns_in_the_template(chat):
    spec = _file_spec(
        {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "6 times 7?"}]}
    )
    (prompt,) = build_prompts(chat, FILE, 1, 200, 0, spec)
    text = chat.decode(list(prompt.ids))
    assert text.startswith("<s><|system|>\nBe terse.<|end|>\n<|user|>\n")
    assert text.endswith("6 times 7?<|end|>\n<|assistant|>\n")


# --- answers -----------------------------------------------------------------------------------------------


def test_answers_match_after_normalising_the_first_line_only():
    assert exact_match(" Paris.\nIt is the capital of France.", "paris")
    assert exact_match("\n\n  PARIS ", "Paris")
    assert exact_match("$1,240.00", "$1,240.00") and exact_match("1240.00", "$1,240.00")
    assert not exact_match("Paris, France", "Paris")
    assert not exact_match("It is Paris.", "Paris")
    assert exact_match(" 58213. Remember it. 58213 is", "58213") and exact_match("3.10 exactly", "3.10") is False


def test_a_pass_key_is_the_first_number_of_the_answer():
    assert key_found(" 58213. Remember it.", "58213")
    assert key_found("The pass key is 58213.", "58213")
    assert not key_found(" 582135", "58213") and not key_found(" 5821", "58213") and not key_found("none", "58213")
    passkey = Prompt((1,), "58213", 0.5, PASSKEY)
    assert answer_correct(passkey, " 58213 is it") and not answer_correct(passkey, " 1 58213")
    assert not answer_correct(Prompt((1,), None, None, FILE), "anything")


# --- the task's version in the cell id ---------------------------------------------------------------------


def test_a_cells_id_changes_with_the_task_it_is_fed():
    """A cell id hashes the prompts' version with the inputs settings (recipe rebuilt by hand here): when the
    task changes, a resumed sweep measures the cell again instead of keeping a verdict the old task made."""
    import dataclasses
    import hashlib
    import json

    from kvsweep.grid import PROTOCOL_VERSION, Cell, MeasureProtocol, cell_id

    spec = InputSpec(depths=(0.1, 0.5, 0.9), chat_template=True, quality_trials=16)
    protocol = MeasureProtocol.exact(warmup=1, repeats=3, seed=0, device="cpu", threads=1, inputs=spec)
    inputs = {"depths": [0.1, 0.5, 0.9], "chat_template": True, "quality_trials": 16, "file_sha256": ""}

    def hashed(cell: Cell, prompts_version: int) -> str:
        fields = {**dataclasses.asdict(protocol), "inputs": {**inputs, "prompts_version": prompts_version}}
        fields.pop("workload")  # none: a fixed-shape sweep's ids leave it out, as they leave the cell's empty ones
        cell_fields = {k: v for k, v in dataclasses.asdict(cell).items() if k not in ("workload", "serving", "rate")}
        payload = {"version": PROTOCOL_VERSION, "cell": cell_fields, "protocol": fields}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    text_fed = Cell("org/model", "float32", 512, 1, 32, "dynamic", False, inputs="passkey")
    assert cell_id(text_fed, protocol) == hashed(text_fed, PROMPTS_VERSION)
    assert cell_id(text_fed, protocol) != hashed(text_fed, PROMPTS_VERSION - 1)
