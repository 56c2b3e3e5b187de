"""What a cell's calls are fed: seeded random ids, or prompts of text built with the model's own tokenizer.

Every timed call gets the same `ids`; a text-fed cell also keeps the task prompts behind them (the
first batch of them *are* the timed ids), so timing and quality come from one input set. Every
strategy of a (model, batch, context) pair builds the same prompts: they depend on the seed, the
context, the row and the sweep's inputs settings only; `sha256` lets a reader check that.
"""

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.inputs.prompt import Prompt
from kvsweep.inputs.prompts import build_prompts, minimum_context, prompts_sha256
from kvsweep.inputs.spec import RANDOM, kind_of, suite_of
from kvsweep.inputs.tasks.suite import minimum_contexts
from kvsweep.models.resolve import classify, load_tokenizer


@dataclass(frozen=True)
class Feed:
    ids: torch.Tensor  # (batch, context) on the cell's device: what every timed call gets
    sha256: str  # the `inputs_sha256` param: the ids (text-fed: every task prompt and its answer)
    prompts: list[Prompt] = field(default_factory=list)  # text-fed: each task's prompts, whole batches each
    tokenizer: Any = None  # text-fed: decodes the answers
    left_out: str = ""  # a suite's tasks too long for this context: 'cwe needs 813 tokens'


def feed_for(cell: Cell, protocol: MeasureProtocol, vocab_size: int, trust_remote_code: bool) -> Feed | str:
    """The cell's inputs, or why the cell is skipped (a context too short for the prompt's fixed part)."""
    if cell.inputs == RANDOM:
        ids = random_ids(vocab_size, cell.batch_size, cell.context_length, protocol.measure.seed)
        return Feed(ids.to(protocol.device), hashlib.sha256(ids.numpy().tobytes()).hexdigest())
    kind, spec = kind_of(cell.inputs), protocol.inputs
    tokenizer = load_tokenizer(classify(cell.model), trust_remote_code)
    left_out = ""
    if suite_of(kind, spec):
        least = minimum_contexts(tokenizer, suite_of(kind, spec), spec.chat_template)
        fits = tuple(task for task, tokens in least.items() if tokens <= cell.context_length)
        if not fits:
            shortest = min(least.values())
            return f"context {cell.context_length} is shorter than any task's fixed part ({shortest} tokens)"
        left_out = ", ".join(f"{t} needs {n} tokens" for t, n in least.items() if n > cell.context_length)
        spec = replace(spec, tasks=fits)
    else:
        shortest = minimum_context(tokenizer, kind, spec)
        if cell.context_length < shortest:
            return f"context {cell.context_length} is shorter than a {kind} prompt's fixed part ({shortest} tokens)"
    rows = task_rows(cell.batch_size, spec.quality_trials)
    prompts = build_prompts(tokenizer, kind, rows, cell.context_length, protocol.measure.seed, spec)
    ids = torch.tensor([p.ids for p in prompts[: cell.batch_size]], dtype=torch.long)
    return Feed(ids.to(protocol.device), prompts_sha256(prompts), prompts, tokenizer, left_out)


def task_rows(batch: int, trials: int) -> int:
    """Prompts a cell builds of each task: at least `trials`, in whole batches (a trial call has the cell's
    shape), and at least one batch (the timed calls' own)."""
    return max(1, math.ceil(trials / batch)) * batch


def random_ids(vocab_size: int, batch: int, context: int, seed: int) -> torch.Tensor:
    """Seeded random token ids, the same for every strategy of a (batch, context) pair (on the host)."""
    generator = torch.Generator().manual_seed(seed + 7919 * context + batch)
    return torch.randint(0, vocab_size, (batch, context), generator=generator)
