"""What `report.objective` ranks a group's candidates by, and when two of them are tied on it.

latency: the ranked timing, lowest first; memory: the least (bytes are counted, not sampled: no tie); throughput:
the most tokens per second, tied when their decode (a fixed shape's TPOT) or a workload's per-request end-to-end
times cannot be told apart; goodput: the most requests per second within the SLOs, tied on a workload when McNemar's
test on which requests met them does not separate the two (a fixed shape meets its SLOs as a constraint, and is then
ranked as for throughput).
"""

import math

from kvsweep.config.schema import OBJECTIVES
from kvsweep.names import Metric
from kvsweep.report.constraints import at_rank
from kvsweep.report.ranking import Ranking, paired_goodput, tied
from kvsweep.report.selection_entry import Entry
from kvsweep.report.selection_settings import Settings
from kvsweep.results import CellResult

LATENCY, MEMORY, THROUGHPUT, GOODPUT = OBJECTIVES
OBJECTIVE_WORDS = {LATENCY: "fastest", MEMORY: "leanest", THROUGHPUT: "highest throughput", GOODPUT: "most goodput"}


def memory_of(entry: Entry) -> float:
    return math.inf if entry.memory is None else entry.memory


def _throughput(result: CellResult) -> float:
    """Tokens per second: a workload's generated tokens over its replay, a fixed shape's decode rate."""
    name = Metric.OUTPUT_TOKENS_PER_S if result.cell.is_workload else Metric.DECODE_TOKENS_PER_S
    return result.metrics.get(name, 0.0)


def _goodput(result: CellResult) -> float:
    """Requests per second within the SLOs (a workload; without an SLO all requests count); a fixed shape meets
    its SLOs as a constraint, so its goodput is its decode rate."""
    m = result.metrics
    if not result.cell.is_workload:
        return m.get(Metric.DECODE_TOKENS_PER_S, 0.0)
    return m.get(Metric.GOODPUT_REQUESTS_PER_S, m.get(Metric.REQUESTS_PER_S, 0.0))


def objective_key(entry: Entry, objective: str) -> tuple:
    """Best first: lowest latency, least memory (then latency), most tokens or good requests per second."""
    speed = math.inf if entry.speed is None else entry.speed
    if objective == MEMORY:
        return (memory_of(entry), speed)
    if objective == THROUGHPUT:
        return (-_throughput(entry.result), speed)
    if objective == GOODPUT:
        return (-_goodput(entry.result), speed)
    return (speed, memory_of(entry))


def objective_tie(entry: Entry, best: Entry, ranking: Ranking, settings: Settings) -> tuple[bool, str]:
    """Whether `entry` cannot be told from `best` on what the objective ranks, and by which test: the ranked
    timing for latency; decode time (TPOT) or, over a workload's requests, end-to-end time for throughput; the
    requests meeting the SLOs (McNemar) for a workload's goodput."""
    a, b = entry.result, best.result
    if settings.objective == GOODPUT and ranking.workload:
        met = paired_goodput(a, b, settings.slo_ttft_ms, settings.slo_tpot_ms)
        if met is not None:
            return met.p_value >= 0.05, "McNemar on requests within the SLOs"
    if settings.objective in (THROUGHPUT, GOODPUT):
        timing = Metric.E2E_MS if ranking.workload else Metric.TPOT_MS
        return tied(a, b, Ranking(at_rank(timing, ranking), timing, ranking.workload), timing)
    return tied(a, b, ranking)
