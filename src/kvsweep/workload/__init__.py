"""Workloads: a mix of requests of different prompt and output lengths that every KV cache strategy replays alike.

Pure building blocks (standard library only): where a mix comes from (`mix_sources`), what it is (`request_mix`)
and the per-request statistics read from its replay (`latency_stats`).
"""

from kvsweep.workload.latency_stats import PercentileEstimate, RequestTiming, compile_payback, goodput
from kvsweep.workload.mix_sources import (
    LengthDist,
    LengthSpec,
    lengths_mix,
    parse_length_spec,
    poisson_arrivals,
    trace_mix,
)
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError

__all__ = [
    "LengthDist",
    "LengthSpec",
    "PercentileEstimate",
    "Request",
    "RequestMix",
    "RequestTiming",
    "WorkloadError",
    "compile_payback",
    "goodput",
    "lengths_mix",
    "parse_length_spec",
    "poisson_arrivals",
    "trace_mix",
]
