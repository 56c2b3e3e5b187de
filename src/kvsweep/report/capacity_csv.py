"""capacity.csv: one row per frontier, batch and context searches in one file, for scripts and spreadsheets.

A batch frontier fills `context_length` (the size it held) and `max_batch`; a context frontier fills
`batch_size` and `max_context`; the other pair stays empty, and `axis` says which it is. Every column is
always there (empty where a row has no value), so a script reads every sweep's file the same way.
`pick` is true on the strategy the selection recommends at that size; `quality_refusal` says why the
quality gate keeps a strategy from being recommended (empty when it does not). `joules_per_token` is the
frontier cell's own metric: the energy of all the GPUs that cell ran on (a split cell sums them,
`measure/energy.py`), as `cost_per_1m_tokens` pays for all of them (`ray.gpus_per_cell`).
"""

import csv
import io

from kvsweep.capacity.frontier import BATCH
from kvsweep.names import Metric, ci_high
from kvsweep.report.capacity import Capacity, SizeChoice, Standing

COLUMNS = (
    "axis",
    "model",
    "dtype",
    "cache",
    "compile",
    "inputs",
    "max_new_tokens",
    "context_length",
    "batch_size",
    "max_batch",
    "max_context",
    "limit",
    "goodput_tokens_per_s",
    Metric.PREDICTED_MAX_BATCH,
    Metric.PREDICTED_MAX_CONTEXT,
    "probes",
    ci_high(Metric.TPOT_MS),
    ci_high(Metric.TTFT_MS),
    Metric.JOULES_PER_TOKEN,
    "cost_per_1m_tokens",
    "pick",
    "quality_refusal",
    "cell_id",
    "detail",
)


def capacity_csv(capacity: Capacity) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for choice in capacity.choices:
        for standing in choice.standings:
            writer.writerow(_row(choice, standing, capacity))
    return out.getvalue()


def _blank(value: object) -> object:
    return "" if value is None else value


def _row(choice: SizeChoice, standing: Standing, capacity: Capacity) -> list[object]:
    frontier, key = standing.frontier, standing.frontier.key
    batch = key.axis == BATCH
    metrics = frontier.at.metrics if frontier.at is not None else {}
    goodput = frontier.goodput_tokens_per_s
    sizes = [key.fixed, "", frontier.value, ""] if batch else ["", key.fixed, "", frontier.value]
    predicted = [frontier.predicted, None] if batch else [None, frontier.predicted]
    return [
        key.axis,
        key.model,
        key.dtype,
        key.cache,
        key.compile,
        key.inputs,
        key.max_new_tokens,
        *sizes,
        frontier.limit,
        _blank(goodput),
        *map(_blank, predicted),
        frontier.probes,
        _blank(metrics.get(ci_high(Metric.TPOT_MS))),
        _blank(metrics.get(ci_high(Metric.TTFT_MS))),
        _blank(metrics.get(Metric.JOULES_PER_TOKEN)),
        _blank(capacity.context.cost_per_1m_tokens(goodput)),
        str(choice.pick is standing).lower(),
        "; ".join(standing.gate.refusals),
        frontier.at.cell_id if frontier.at is not None else "",
        frontier.detail,
    ]
