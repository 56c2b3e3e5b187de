"""The inputs every cell of a sweep is fed, as sent to the cells (`MeasureProtocol.inputs`).

Torch-free: the driver builds it from the `inputs` config and the prompts file it has read; a cell
turns it into token ids with the model's tokenizer (`prompts.py`). Each cell's own kind (`random`,
`tasks`, `passkey` or `file:<name>`) is the cell's `inputs` field, chosen per model (`driver/inputs_choice.py`).
"""

from dataclasses import asdict, dataclass
from typing import Any

RANDOM, PASSKEY, FILE, TASKS = "random", "passkey", "file", "tasks"
AUTO = "auto"
SOURCES = (AUTO, RANDOM, TASKS, PASSKEY, FILE)
FILE_PREFIX = "file:"
# The text prompts' version: the filler, the passkey layout and wording. Part of every text-fed cell's id,
# so a resumed sweep never keeps a verdict an older task made. 2: generated country prose instead of the
# standard library's docstrings, the needle between sentences, the answer's lead opening the reply.
PROMPTS_VERSION = 2
# The task suite's version (`inputs/tasks/`): its layouts, wording and scoring. Part of every suite cell's id.
TASKS_VERSION = 1


@dataclass(frozen=True)
class InputSpec:
    depths: tuple[float, ...]  # passkey: where the needles sit, as a share of the context
    chat_template: bool  # wrap prompts in the tokenizer's chat template when it has one
    quality_trials: int  # task prompts a cell answers after its timed calls (at least; whole batches)
    file_name: str = ""  # source=file: the prompts file's name (the `inputs` param says `file:<name>`)
    file_sha256: str = ""  # ...and its bytes' hash: a changed file is a new cell
    records: tuple[dict[str, Any], ...] = ()  # ...and its prompts as read (`prompt_file.read_prompt_file`)
    tasks: tuple[str, ...] = ()  # the suite a cell fed `tasks` runs (`inputs.tasks`), each `quality_trials` times

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InputSpec":
        return cls(
            **{
                **data,
                "depths": tuple(data["depths"]),
                "records": tuple(data.get("records", ())),
                "tasks": tuple(data.get("tasks", ())),
            }
        )

    def identity(self) -> dict[str, Any]:
        """What a text-fed cell's id hashes: everything that changes the prompts, the file by its hash."""
        return {
            "depths": list(self.depths),
            "chat_template": self.chat_template,
            "quality_trials": self.quality_trials,
            "file_sha256": self.file_sha256,
            "prompts_version": PROMPTS_VERSION,
            **({"tasks": list(self.tasks), "tasks_version": TASKS_VERSION} if self.tasks else {}),
        }


def kind_of(inputs: str) -> str:
    """`random`, `tasks`, `passkey` or `file` from a cell's `inputs` field (`file:prompts.jsonl` is a file)."""
    return FILE if inputs.startswith(FILE_PREFIX) else inputs


def suite_of(kind: str, spec: InputSpec) -> tuple[str, ...]:
    """The tasks a cell of this kind runs: the suite's, passkey alone, or none (random ids, a prompts file)."""
    return spec.tasks if kind == TASKS else (PASSKEY,) if kind == PASSKEY else ()
