"""A workload sweep's cells: one per model, weights, dtype, cache, compile, serving mode, B and offered rate
(`workload.rate`), each replaying the sweep's request mix (at its rate, with that rate's arrival times).

A cell's context is the mix's longest prompt and its new tokens what the worst moment adds to it, so the planner
fits that moment as it fits a fixed-shape cell: the longest request for sequential and continuous serving (the
page pool holds B rows of it), and for batched the worst static batch (every row padded to the batch's longest
prompt and run to its longest output, as `generate` runs a batch), B rows of it. Sequential serving
is B = 1 whatever `grid.batch_sizes` says. Continuous batching is Transformers' paged engine: another cache under
it is planned as skipped, saying so.
"""

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvsweep.caches import CacheStrategy, get_strategy
from kvsweep.errors import ConfigError
from kvsweep.grid import NO_WEIGHT_QUANTIZATION, Cell
from kvsweep.inputs.spec import FILE_PREFIX, RANDOM
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.workload.request_mix import RequestMix, WorkloadError
from kvsweep.workload.workload_spec import BATCHED, CONTINUOUS, FILE, SEQUENTIAL, TRACE, WorkloadSpec, fitted

NOT_CONTINUOUS = "continuous serving is Transformers' continuous batching over its paged cache: use cache paged"


def model_mix(workload: WorkloadSpec, model: str, positions: int | None) -> RequestMix:
    """`model`'s mix on its `positions` positions; a trace's request or a file's prompt that does not fit is a
    config error (a drawn one is shortened to fit)."""
    try:
        mix = workload.mix_for(model)
        if workload.source in (TRACE, FILE) and positions is not None and mix.longest_total > positions:
            index = next(i for i, r in enumerate(mix.requests) if r.total_tokens > positions)
            raise ConfigError(f"{_request_name(workload, mix, index)} is beyond {model}'s {positions} positions")
        return fitted(mix, positions)
    except WorkloadError as err:
        raise ConfigError(str(err)) from None


def _request_name(workload: WorkloadSpec, mix: RequestMix, index: int) -> str:
    """'workload.path request 3: input_tokens + output_tokens = 9000', or a prompts file's line and lengths."""
    request = mix.requests[index]
    if workload.prompts is not None:
        line = workload.prompts.records[index].get("line", index + 1)
        return (
            f"workload.path {workload.prompts.file_name} line {line}: a prompt of {request.input_tokens} tokens "
            f"+ {request.output_tokens} output tokens = {request.total_tokens}"
        )
    return f"workload.path request {index + 1}: input_tokens + output_tokens = {request.total_tokens}"


def workload_cells(
    grid: dict[str, Any],
    serving: list[str],
    workload: WorkloadSpec,
    positions: dict,
    rates: Sequence[float] = (0.0,),
) -> list[Cell]:
    """Every workload cell, in the config's order; `positions`: each model's (None when unknown); `rates`: the
    offered rates (`workload_spec.rate_axis`: 0 is a closed loop). A cell's lengths do not depend on its rate."""
    cells: dict[Cell, None] = {}
    axes = [
        grid["models"],
        grid.get("weights") or [NO_WEIGHT_QUANTIZATION],
        grid["dtypes"],
        serving,
        grid["batch_sizes"],
        rates,
        grid["caches"],
        grid["compile"],
    ]
    for model, weights, dtype, mode, batch, rate, cache, compiled in itertools.product(*axes):
        if compiled and not get_strategy(cache).compilable:
            continue
        mix = model_mix(workload, model, positions.get(model))
        rows = 1 if mode == SEQUENTIAL else batch
        context = mix.longest_input
        new = worst_total(mix, rows if mode == BATCHED else 1) - context  # the cell caches the worst moment's tokens
        fed = RANDOM if workload.prompts is None else FILE_PREFIX + workload.prompts.file_name
        cell = Cell(model, dtype, context, rows, new, cache, bool(compiled), fed, weights, workload.name, mode, rate)
        cells.setdefault(cell, None)
    return list(cells)


def worst_total(mix: RequestMix, rows: int) -> int:
    """The most positions a row needs: a request's prompt and output; in static batches of `rows` consecutive
    requests, every row padded to its batch's longest prompt and run to its longest output, as `generate` runs."""
    groups = [mix.requests[i : i + rows] for i in range(0, len(mix.requests), rows)]
    return max(max(r.input_tokens for r in g) + max(r.output_tokens for r in g) for g in groups)


def served_strategy(strategy: CacheStrategy, cell: Cell) -> CacheStrategy:
    """A static layout under a mix (static, offloaded_static, `@N`) is sized for its worst moment (the cell's
    cached tokens: its longest request, or its longest batch) or its `@N` if longer, for every request; a paged
    pool is sized by `paged_pool` already. The cell runs it so, and the forecast counts it so."""
    if strategy.preallocates and strategy.family != "paged":
        return replace(strategy, reserve_tokens=strategy.static_length(cell.cached_tokens))  # its name kept
    return strategy


def serving_problem(planned: PlannedCell) -> PlannedCell:
    """A cell the serving mode cannot run, planned as skipped with the reason; any other as planned."""
    cell = planned.cell
    if planned.runs and cell.serving == CONTINUOUS and get_strategy(cell.cache).family != "paged":
        return replace(planned, skip_reason=f"{cell.cache}: {NOT_CONTINUOUS}")
    return planned
