"""One prompt a cell is fed, as token ids, with what its answer must say (torch-free)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    answer: str | None  # what is expected, as written in task.jsonl (a task's values joined by ', '); None: nothing
    depth: float | None  # needle tasks: where the needle asked for sits, as a share of the context
    kind: str  # passkey, file, or a suite task's name (niah_single, vt, ...)
    values: tuple[str, ...] = ()  # a suite task's expected values, each of which the answer must contain
