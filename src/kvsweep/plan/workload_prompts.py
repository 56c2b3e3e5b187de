"""A prompts-file workload's lengths: each model's tokenizer encodes every prompt once, in the driver.

How long a request is decides what the planner fits and what a static cache reserves, and for the user's own text
that length is the tokenizer's, model by model. The driver encodes the prompts (framed as the cell frames them:
`inputs.prompts.whole_prompt`) before Ray starts; the cell encodes them again with its own copy of the tokenizer
and refuses to run when the two disagree, so a planned length is the length that ran.
"""

import functools
from typing import Any

from kvsweep.errors import ConfigError, first_line
from kvsweep.inputs.prompts import whole_prompt
from kvsweep.models.resolve import classify, load_tokenizer
from kvsweep.workload.workload_spec import WorkloadPrompts, WorkloadSpec


@functools.cache
def _tokenizer(model: str, trust_remote_code: bool) -> Any:
    """Each model's tokenizer, loaded once per process (the planner asks for the lengths more than once)."""
    return load_tokenizer(classify(model), trust_remote_code)


def with_prompt_lengths(workload: WorkloadSpec, models: list[str], trust_remote_code: bool) -> WorkloadSpec:
    """`workload` with every model's prompt lengths (unchanged unless it is a prompts file); a model whose
    tokenizer does not load is a config error of one line: its requests would have no length."""
    if workload.prompts is None:
        return workload
    lengths = {}
    for model in dict.fromkeys(models):
        try:
            tokenizer = _tokenizer(model, trust_remote_code)
        except Exception as exc:  # a preset, a broken folder, an unreachable Hub: whatever it raises, in one line
            raise ConfigError(
                f"workload.source=file: {model} has no tokenizer to encode {workload.prompts.file_name} with "
                f"({type(exc).__name__}: {first_line(exc)})"
            ) from None
        lengths[model] = _lengths_or_error(workload.prompts, tokenizer, model)
    return workload.with_lengths(lengths)


def _lengths_or_error(prompts: WorkloadPrompts, tokenizer: Any, model: str) -> tuple[int, ...]:
    """Each prompt's tokens as `tokenizer` frames and encodes it, or a one-line ConfigError naming the prompt it
    refused (a chat template that takes no system turn, turns that must alternate)."""
    lengths = []
    for record in prompts.records:
        try:
            lengths.append(len(whole_prompt(tokenizer, record, prompts.chat_template).ids))
        except Exception as exc:  # whatever the template engine raises, in one line
            raise ConfigError(
                f"workload.path {prompts.file_name} line {record.get('line', '?')}: {model}'s tokenizer cannot "
                f"frame it ({type(exc).__name__}: {first_line(exc)})"
            ) from None
    return tuple(lengths)
