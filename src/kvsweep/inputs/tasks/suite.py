"""The task suite: every task by name, the default set, and the version a cell's id carries.

RULER's synthetic categories (Hsieh et al., 2024, "RULER: What's the Real Context Size of Your Long-Context
Language Models?"), re-implemented here and generated offline at each cell's context length: retrieval
(`niah_single`, `niah_multikey`, `niah_multivalue`, `niah_multiquery`), multi-hop tracing (`vt`) and aggregation
(`cwe`, `fwe`); and kvsweep's `passkey`. `inputs.tasks` picks them.
"""

from typing import Any

from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.tasks.aggregation import CommonWords, FrequentWords
from kvsweep.inputs.tasks.base import Task, TaskKit
from kvsweep.inputs.tasks.niah import NiahMultikey, NiahMultiquery, NiahMultivalue, NiahSingle
from kvsweep.inputs.tasks.passkey_task import Passkey
from kvsweep.inputs.tasks.tracing import VariableTracking

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Passkey(), NiahSingle(), NiahMultikey(), NiahMultivalue(), NiahMultiquery(), VariableTracking(),
        CommonWords(), FrequentWords(),
    )
}  # fmt: skip
# What `inputs.tasks` runs unless told: the tasks a model of SmolLM2-135M's size does at 1-4k tokens (so they
# judge its caches), and the harder retrieval that separates low-bit caches there (BENCHMARKS.md, "Task suite").
DEFAULT_TASKS = ("passkey", "niah_single", "niah_multikey", "vt")


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def task_prompts(
    tokenizer: Any, tasks: tuple[str, ...], per_task: int, context: int, seed: int, depths: tuple[float, ...],
    chat_template: bool,
) -> list[Prompt]:  # fmt: skip
    """`per_task` prompts of each task in turn, each exactly `context` tokens."""
    kit = TaskKit(tokenizer, chat_template)
    return [get_task(name).prompt(kit, index, context, seed, depths) for name in tasks for index in range(per_task)]


def minimum_contexts(tokenizer: Any, tasks: tuple[str, ...], chat_template: bool) -> dict[str, int]:
    """The fewest tokens each task's prompts fit in."""
    kit = TaskKit(tokenizer, chat_template)
    return {name: get_task(name).minimum_context(kit) for name in tasks}


def answer_budget(tokenizer: Any, prompts: list[Prompt]) -> int:
    """New tokens a batch of suite prompts generates: what its longest answer needs."""
    kit = TaskKit(tokenizer, False)
    return max(get_task(prompt.kind).answer_budget(kit, prompt) for prompt in prompts)


def score(prompt: Prompt, text: str) -> list[bool]:
    """Which of a suite prompt's expected values the answer has."""
    return get_task(prompt.kind).score(prompt, text)
