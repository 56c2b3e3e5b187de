"""What a run's first lines say it feeds the cells: each model's inputs, what a search replaces, or the mix.

A workload sweep feeds its cells the mix, not `inputs.source`'s prompts, so its first lines name the mix (where it
came from, how many requests, its sha256) and, for a prompts file, how long the prompts are under each model's
tokenizer and how many carry an answer to score.
"""

from kvsweep.config.schema import KvSweepConfig
from kvsweep.driver.capacity_search import search_lines
from kvsweep.driver.inputs_choice import InputsChoice
from kvsweep.model_names import display_names
from kvsweep.plan.sweep_plan import sweep_workload
from kvsweep.workload.workload_spec import WorkloadSpec


def first_lines(cfg: KvSweepConfig, inputs: InputsChoice) -> list[str]:
    workload = sweep_workload(cfg)
    if workload is None:
        return [*inputs.lines(), *search_lines(cfg)]
    return workload_lines(workload, list(cfg.workload.serving))


def workload_lines(workload: WorkloadSpec, serving: list[str]) -> list[str]:
    """'workload chat: lengths input=... (32 requests, sha256 1a2b3c4d5e6f), served sequential, continuous'."""
    mix, prompts = workload.mix, workload.prompts
    sha256 = f"file sha256 {prompts.file_sha256[:12]}" if prompts else f"sha256 {mix.sha256[:12]}"
    lines = [f"workload {workload.name}: {mix.name} ({len(mix)} requests, {sha256}), served {', '.join(serving)}"]
    if prompts is not None:
        answered = sum("answer" in record for record in prompts.records)
        names = display_names(list(prompts.lengths))
        for model, lengths in prompts.lengths.items():
            lines.append(
                f"  prompts for {names[model]}: {min(lengths)}-{max(lengths)} tokens "
                f"(inputs.chat_template={str(prompts.chat_template).lower()}); {answered} with an answer to score"
            )
    return lines
