"""What each cache of a workload generated, against dynamic: token agreement over the mix's own prompts.

Every workload cell keeps each request's greedy tokens (`samples.json`); the report compares each strategy's with
the same workload's dynamic cell (eager), request by request, and writes `token_agreement` and `first_divergence`
onto the results it reads, so the selection flags a cache whose answers drift on this traffic as it flags one on
a fixed shape. A report rebuilt from MLflow alone has no samples at hand and leaves them out.
"""

from collections import defaultdict

from kvsweep.caches import BASELINE
from kvsweep.names import Metric
from kvsweep.report.selection import group_key
from kvsweep.results import OK, CellResult

REQUESTS = "requests"  # the samples key of a workload cell's per-request records (workload_cell.py)


def mix_agreement(tokens: list[list[int]], baseline: list[list[int]]) -> tuple[float, int]:
    """(share of generated positions equal to the baseline's over every request, the earliest position at which
    any request differs: its length when none does)."""
    equal = total = 0
    first = max((len(t) for t in tokens), default=0)
    for mine, theirs in zip(tokens, baseline, strict=True):
        for position, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            total += 1
            equal += a == b
            if a != b:
                first = min(first, position)
    return (equal / total if total else 1.0), first


def fill_agreement(results: list[CellResult]) -> dict[str, dict[str, float]]:
    """Each ok workload cell with its requests' tokens, against the same mix's dynamic cell (eager): of its own
    serving mode and B when there is one, else any (greedy tokens do not depend on how requests were served, and
    continuous serving has no dynamic cell). Left alone without one. Returns what it filled, by cell id (for the
    cells' MLflow runs)."""
    filled: dict[str, dict[str, float]] = {}
    mixes: dict[tuple, list[CellResult]] = defaultdict(list)
    for result in results:
        if result.cell.is_workload and result.status == OK and _tokens(result):
            c = result.cell
            mixes[(c.model, c.dtype, c.weights, c.workload)].append(result)
    for cells in mixes.values():
        dynamic = [r for r in cells if r.cell.cache == BASELINE and not r.cell.compile]
        for result in cells:
            same = [r for r in dynamic if group_key(r) == group_key(result)]
            baseline = (same or dynamic or [None])[0]
            if baseline is not None and (found := _fill(result, _tokens(baseline))):
                filled[result.cell_id] = found
    return filled


def _fill(result: CellResult, baseline: list[list[int]]) -> dict[str, float]:
    mine = _tokens(result)
    if Metric.TOKEN_AGREEMENT in result.metrics or [len(t) for t in mine] != [len(t) for t in baseline]:
        return {}
    share, first = mix_agreement(mine, baseline)
    found = {Metric.TOKEN_AGREEMENT: share, Metric.FIRST_DIVERGENCE: float(first)}
    result.metrics.update(found)
    return found


def _tokens(result: CellResult) -> list[list[int]]:
    requests = result.samples.get(REQUESTS) or []
    tokens = [list(r.get("tokens") or []) for r in requests]
    return tokens if tokens and all(tokens) else []
