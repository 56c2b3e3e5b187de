"""The task suite's prompts: exactly the context's length, holding what they ask for, answerable from the text.

Each expectation is read back from the decoded prompt, independently of how it was built: the needle asked for is in
the text at its depth, the variables the chain assigns the value to are found by following the decoded
statements, the common and frequent words are recounted from the decoded list. Two tokenizers of different kinds
(byte-level BPE, as GPT-2 and Llama 3 have, and a SentencePiece-style one that marks word starts, as Llama 2 and
Mistral have) so that a layout that only works for one is caught.
"""

import re
import string
from collections import Counter

import pytest

from kvsweep.inputs.filler import paragraph
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.scoring import answer_correct, value_hits
from kvsweep.inputs.tasks.base import TaskKit
from kvsweep.inputs.tasks.niah import INTRO as NIAH_INTRO
from kvsweep.inputs.tasks.suite import TASKS, get_task, minimum_contexts, task_prompts
from kvsweep.inputs.tasks.vocabulary import ADJECTIVES, NOUNS, pseudo_words

DEPTHS = (0.1, 0.5, 0.9)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _corpus() -> list[str]:
    import random

    rng = random.Random(0)
    words = " ".join(pseudo_words(rng, 3000))
    keys = " ".join(f"{a}-{n}" for a in ADJECTIVES for n in NOUNS[:5])
    numbers, capitals = " ".join(map(str, range(2000))), " ".join(string.ascii_uppercase)
    return [*(" ".join(paragraph(i)) for i in range(300)), words, keys, NIAH_INTRO, numbers, capitals, "VAR A = VAR B."]


def _byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=900, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(_corpus(), trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _metaspace():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.normalizer = normalizers.Replace(" ", "▁")
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    bpe.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = sorted(set("".join(_corpus()) + "\n.,:?'()-▁"))
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet)
    bpe.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module", params=["byte-level", "metaspace"])
def tokenizer(request):
    return _byte_level() if request.param == "byte-level" else _metaspace()


def _text(tokenizer, prompt: Prompt) -> str:
    return tokenizer.decode(list(prompt.ids), skip_special_tokens=True)


@pytest.mark.parametrize("task", list(TASKS))
def test_every_prompt_is_exactly_its_context_from_the_shortest_up(tokenizer, task):
    least = minimum_contexts(tokenizer, (task,), True)[task]
    for context in (least, least + 37, 3000, 20_000):
        prompts = task_prompts(tokenizer, (task,), 3, context, 0, DEPTHS, True)
        assert [len(p.ids) for p in prompts] == [context] * 3, (task, context)
        assert len({p.ids for p in prompts}) == 3  # each trial its own prompt
        assert all(p.kind == task and p.values and p.answer == ", ".join(p.values) for p in prompts)


@pytest.mark.parametrize("task", ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"])
def test_each_needle_asked_for_is_in_the_text_once_at_its_depth(tokenizer, task):
    """The decoded prompt says 'special magic numbers for <key> is: <value>' for every expected value, each once,
    and the key the question names is the needle's; the needle asked for sits near its depth of the text."""
    context = 4000
    for index, prompt in enumerate(task_prompts(tokenizer, (task,), 6, context, 3, DEPTHS, True)):
        text = _text(tokenizer, prompt)
        body, _, question = text.rpartition("What ")
        needles = re.findall(r"special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", body)
        assert len(needles) == (1 if task == "niah_single" else 4), needles
        by_value = {value: key for key, value in needles}
        asked = re.findall(r"[a-z]+-[a-z]+", question)
        assert {by_value[v] for v in prompt.values} == set(asked), (prompt.values, asked)
        assert all(body.count(v) == 1 for v in prompt.values)
        first = prompt.values[0]
        start = body.index("following text.") + len("following text.")
        at = (body.index(first) - start) / (len(body) - start)
        assert abs(at - DEPTHS[index % 3]) < 0.08, (task, index, at)


def test_variable_tracking_answer_is_the_chain_read_back_from_the_text(tokenizer):
    for prompt in task_prompts(tokenizer, ("vt",), 5, 3000, 1, DEPTHS, True):
        text = _text(tokenizer, prompt)
        value = re.search(r"assigned the value (\d+) in the text above", text).group(1)
        assigned: dict[str, str] = dict(re.findall(r"VAR ([A-Z]{5}) = (\d+|VAR [A-Z]{5})\.", text))
        holds = {name for name, what in assigned.items() if what == value}
        grown = True
        while grown:
            more = {name for name, what in assigned.items() if what.removeprefix("VAR ") in holds}
            grown = not more <= holds
            holds |= more
        assert holds == set(prompt.values) and len(holds) == 5
        order = [text.index(f"VAR {name} =") for name in prompt.values]
        assert order == sorted(order)  # the chain in order through the text


def test_common_words_are_the_ten_most_frequent_of_the_decoded_list(tokenizer):
    for context in (1200, 8000):
        for prompt in task_prompts(tokenizer, ("cwe",), 3, context, 2, DEPTHS, True):
            text = _text(tokenizer, prompt)
            listed = re.findall(r"\d+\. ([a-z]+)", text.split("Memorize the ones that appear most often.")[1])
            counts = Counter(listed).most_common()
            top = {w for w, _ in counts[:10]}
            assert top == set(prompt.values) and counts[9][1] >= 2 * counts[10][1], counts[:12]
            numbers = [int(n) for n in re.findall(r"(\d+)\. [a-z]+", text)]
            assert numbers == list(range(1, len(numbers) + 1))  # a whole numbered list, none cut


def test_frequent_words_are_the_three_most_frequent_of_the_decoded_text(tokenizer):
    for context in (600, 8000):
        for prompt in task_prompts(tokenizer, ("fwe",), 3, context, 4, DEPTHS, True):
            body = _text(tokenizer, prompt).split("coded words.")[1].split("Question:")[0]
            counts = Counter(w.strip() for w in body.split("....") if w.strip()).most_common()
            assert [w for w, _ in counts[:3]] == list(prompt.values) and counts[2][1] > counts[3][1], counts[:5]


def test_prompts_depend_only_on_seed_context_and_index(tokenizer):
    first = task_prompts(tokenizer, tuple(TASKS), 2, 2500, 0, DEPTHS, True)
    again = task_prompts(tokenizer, tuple(TASKS), 2, 2500, 0, DEPTHS, True)
    other = task_prompts(tokenizer, tuple(TASKS), 2, 2500, 1, DEPTHS, True)
    assert first == again
    assert all(a.ids != b.ids for a, b in zip(first, other, strict=True))


def test_under_its_least_length_a_task_says_how_many_tokens_it_needs(tokenizer):
    task = get_task("niah_multiquery")
    least = task.minimum_context(TaskKit(tokenizer, True))
    with pytest.raises(ValueError, match=r"niah_multiquery needs \d+ tokens, not 100"):
        task.prompt(TaskKit(tokenizer, True), 0, 100, 0, DEPTHS)
    assert len(task.prompt(TaskKit(tokenizer, True), 0, least, 0, DEPTHS).ids) == least


def _prompt(kind: str, values: tuple[str, ...]) -> Prompt:
    return Prompt((1,), ", ".join(values), None, kind, values)


@pytest.mark.parametrize(
    ("kind", "values", "answer", "hits"),
    [
        ("niah_single", ("4827193",), " 4827193.", [True]),
        ("niah_single", ("4827193",), " The number is 4827193, I think", [True]),
        ("niah_single", ("4827193",), " 482719", [False]),
        (
            "niah_multivalue",
            ("1111111", "2222222", "3333333", "4444444"),
            ": 1111111, 3333333 and 2222222",
            [True, True, True, False],
        ),
        ("vt", ("QXJPT", "MBRKA"), " qxjpt, MBRKA", [True, True]),  # RULER folds case
        ("cwe", ("tavo", "grensa"), " 1. grensa 2. tavomil", [True, True]),  # a substring, as RULER matches
        ("passkey", ("58213",), " 1 58213", [False]),  # the passkey's own rule: the first number is the key
    ],
)
def test_answers_are_scored_as_ruler_scores_them(kind, values, answer, hits):
    prompt = _prompt(kind, values)
    assert value_hits(prompt, answer) == hits
    assert answer_correct(prompt, answer) is all(hits)
