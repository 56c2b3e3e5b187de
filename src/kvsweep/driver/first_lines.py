"""What a run's first lines say it feeds the cells: each model's inputs, what a search replaces, or the mix; and
the cluster it joins where `RAY_ADDRESS` chose it.

A workload sweep feeds its cells the mix, not `inputs.source`'s prompts, so its first lines name the mix (where it
came from, how many requests, its sha256) and, for a prompts file, how long the prompts are under each model's
tokenizer and how many carry an answer to score.
"""

from kvsweep.config.schema import KvSweepConfig
from kvsweep.config.tool_variables import ray_address_note
from kvsweep.driver.capacity_search import search_lines
from kvsweep.driver.inputs_choice import InputsChoice
from kvsweep.measure.statistics import fewest_for_interval
from kvsweep.model_names import display_names
from kvsweep.plan.sweep_plan import sweep_workload
from kvsweep.report.ranking import DEFAULT_PERCENTILE, PERCENTILES, split_rank_by
from kvsweep.workload.workload_spec import WorkloadSpec, rate_axis


def first_lines(cfg: KvSweepConfig, inputs: InputsChoice) -> list[str]:
    """What the cells are fed, then the cluster joined where `RAY_ADDRESS` chose it."""
    joining = [note] if (note := ray_address_note(cfg.ray.address)) else []
    workload = sweep_workload(cfg)
    if workload is None:
        return [*inputs.lines(), *search_lines(cfg), *joining]
    lines = workload_lines(workload, list(cfg.workload.serving), rate_axis(cfg.workload.rate))
    return [*lines, *interval_warning(len(workload.mix), cfg.report.rank_by), *joining]


def interval_warning(requests: int, rank_by: str) -> list[str]:
    """'warning: 12 requests give report.rank_by's p90 no 95% interval (29 do); the selection ranks by p50' when
    the mix is too small for the percentile asked (the selection then ranks by the highest one it can bound)."""
    timing, asked = split_rank_by(rank_by)
    asked = asked or DEFAULT_PERCENTILE
    needed = fewest_for_interval(asked)
    if requests >= needed:
        return []
    usable = [q for q in PERCENTILES if q <= asked and requests >= fewest_for_interval(q)]
    fallback = f"the selection ranks by {timing} p{usable[0]}" if usable else "no percentile has an interval"
    return [
        f"warning: {requests} requests give report.rank_by's p{asked} no 95% interval ({needed} do: "
        f"workload.requests={needed}); {fallback}"
    ]


def workload_lines(workload: WorkloadSpec, serving: list[str], rates: list[float] | None = None) -> list[str]:
    """'workload chat: lengths input=... (32 requests, sha256 1a2b3c4d5e6f), served sequential, continuous', and
    ', at 0.5, 1, 2 requests/s (Poisson arrivals)' for `workload.rate`'s open-loop rates."""
    mix, prompts = workload.mix, workload.prompts
    sha256 = f"file sha256 {prompts.file_sha256[:12]}" if prompts else f"sha256 {mix.sha256[:12]}"
    lines = [f"workload {workload.name}: {mix.name} ({len(mix)} requests, {sha256}), served {', '.join(serving)}"]
    if any(r > 0 for r in rates or []):
        offered = ", ".join("closed loop" if r == 0 else f"{r:g}" for r in rates or [])
        lines[0] += f", at {offered} requests/s (Poisson arrivals)"
    if prompts is not None:
        answered = sum("answer" in record for record in prompts.records)
        names = display_names(list(prompts.lengths))
        for model, lengths in prompts.lengths.items():
            lines.append(
                f"  prompts for {names[model]}: {min(lengths)}-{max(lengths)} tokens "
                f"(inputs.chat_template={str(prompts.chat_template).lower()}); {answered} with an answer to score"
            )
    return lines
