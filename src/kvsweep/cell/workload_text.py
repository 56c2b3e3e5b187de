"""A prompts-file workload in the cell: the user's prompts as this node's tokenizer encodes them, and their answers
scored on what each request generated.

The driver planned every request at the length its copy of the tokenizer gave (`plan/workload_prompts.py`); a
node whose tokenizer encodes a prompt otherwise would replay other requests than the ones planned, so the cell
refuses to run then. A request's answer is judged as a prompts file's answers always are (`inputs.passkey`'s exact
match on the first line), on the tokens the request generated during the measured replay: the accuracy is that of
the traffic as served, by this cache and this serving mode.
"""

from typing import Any

from kvsweep.cell.checks import TaskOutcome, share_metrics, trial_record
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.prompts import whole_prompt
from kvsweep.inputs.scoring import value_hits
from kvsweep.names import Metric
from kvsweep.workload.workload_spec import WorkloadPrompts


class TokenizerMismatch(ValueError):
    """This node encodes a prompt to another length than the driver planned it at."""


def encode_requests(prompts: WorkloadPrompts, tokenizer: Any, planned: tuple[int, ...]) -> list[Prompt]:
    """Each request's prompt, framed as the driver framed it; `planned`: the lengths the driver found."""
    encoded = [whole_prompt(tokenizer, record, prompts.chat_template) for record in prompts.records]
    for prompt, record, length in zip(encoded, prompts.records, planned, strict=True):
        if len(prompt.ids) != length:
            raise TokenizerMismatch(
                f"workload.path {prompts.file_name} line {record.get('line', '?')}: this node's tokenizer encodes "
                f"the prompt as {len(prompt.ids)} tokens, the driver's as {length}; the same tokenizer must run both"
            )
    return encoded


def score_answers(prompts: list[Prompt], generated: list[list[int]], tokenizer: Any, seed: int) -> TaskOutcome:
    """Accuracy over the requests whose prompt has an answer, with its exact 95% interval, and every such request
    as a trial (`task.jsonl`: its index in the mix is its `prompt_index`); empty when the file gives no answers."""
    answered = [i for i, prompt in enumerate(prompts) if prompt.answer is not None]
    if not answered:
        return TaskOutcome()
    texts = tokenizer.batch_decode([generated[i] for i in answered], skip_special_tokens=True)
    hits = [value_hits(prompts[i], text) for i, text in zip(answered, texts, strict=True)]
    metrics = share_metrics(Metric.ANSWER_ACCURACY, [all(found) for found in hits])
    metrics[Metric.TASK_TRIALS] = float(len(answered))
    trials = tuple(
        trial_record(i, seed, prompts[i], text, found) for i, text, found in zip(answered, texts, hits, strict=True)
    )
    return TaskOutcome(metrics, trials)
