"""A sweep's workload as every cell receives it: the mix itself (not a recipe), its name and how it is replayed.

The driver draws the mix once from `workload.*` (a seeded length distribution or a trace) and ships the requests
with the protocol, so every cell of every node replays the very same requests; a cell id hashes the mix by its
sha256. A model with fewer positions than a drawn request gets the same requests with their prompts shortened to
fit (`fitted`), the same way in the planner and in the cell; a trace's request that does not fit is refused.
"""

from dataclasses import asdict, dataclass
from typing import Any

from kvsweep.workload.mix_sources import LengthSpec, lengths_mix, parse_length_spec, poisson_arrivals, trace_mix
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError

LENGTHS, TRACE = "lengths", "trace"
SOURCES = (LENGTHS, TRACE)
SEQUENTIAL, BATCHED, CONTINUOUS = "sequential", "batched", "continuous"
SERVING_MODES = (SEQUENTIAL, BATCHED, CONTINUOUS)


@dataclass(frozen=True)
class WorkloadSpec:
    """The mix (arrival times set when it has them), its short name (the cells' `workload` param) and how many of
    its first requests are replayed once before the measured replay of all of them (a cold prefill shape, a first
    compile: not counted)."""

    name: str
    mix: RequestMix
    warmup_requests: int
    source: str  # lengths | trace: for the dry run and the docs' wording
    slo_ttft_ms: float = 0.0  # `slo.*`: what a request must meet to count as goodput (0: not applied)
    slo_tpot_ms: float = 0.0

    @property
    def open_loop(self) -> bool:
        """Arrival times given (a trace's or `workload.rate`'s): TTFT then includes waiting for a free slot."""
        return self.mix.requests[0].arrival_s is not None

    def identity(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.mix.sha256,
            "warmup_requests": self.warmup_requests,
            "slo": [self.slo_ttft_ms, self.slo_tpot_ms],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": [asdict(r) for r in self.mix.requests],
            "mix_name": self.mix.name,
            "warmup_requests": self.warmup_requests,
            "source": self.source,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WorkloadSpec":
        mix = RequestMix(data["mix_name"], tuple(Request(**r) for r in data["requests"]))
        return cls(data["name"], mix, data["warmup_requests"], data["source"], data["slo_ttft_ms"], data["slo_tpot_ms"])


def fitted(mix: RequestMix, positions: int | None) -> RequestMix:
    """The mix on a model of `positions` positions: each prompt shortened so prompt + output fits (outputs kept,
    so decode is timed over the same tokens); unchanged when every request fits."""
    if positions is None or mix.longest_total <= positions:
        return mix
    requests = []
    for r in mix.requests:
        if r.output_tokens >= positions:
            raise WorkloadError(f"an output of {r.output_tokens} tokens leaves no prompt room in {positions} positions")
        requests.append(Request(min(r.input_tokens, positions - r.output_tokens), r.output_tokens, r.arrival_s))
    return RequestMix(mix.name, tuple(requests))


def workload_from_config(workload: Any, seed: int, slo: Any = None) -> WorkloadSpec | None:
    """`cfg.workload` as a spec, or None when no workload is set (the grid's own axes). Raises WorkloadError in one
    line for anything wrong with it: an unknown source, a bad length spec, a trace line."""
    source = workload.source
    if not source:
        return None
    if source not in SOURCES:
        raise WorkloadError(f"workload.source: unknown source {source!r}; allowed: {', '.join(SOURCES)}")
    if source == LENGTHS:
        if not workload.input_lengths or not workload.output_lengths:
            raise WorkloadError("workload.source=lengths needs workload.input_lengths and workload.output_lengths")
        spec = LengthSpec(
            parse_length_spec(workload.input_lengths, "workload.input_lengths"),
            parse_length_spec(workload.output_lengths, "workload.output_lengths"),
        )
        mix = lengths_mix(spec, workload.requests, seed, max_positions=None)
    else:
        if not workload.path:
            raise WorkloadError("workload.source=trace needs workload.path (a JSONL of input_tokens, output_tokens)")
        mix = trace_mix(workload.path, workload.requests, max_positions=None)
    if workload.rate > 0:
        if mix.requests[0].arrival_s is not None:
            raise WorkloadError(
                f"workload.rate={workload.rate:g} would replace the arrival times of {workload.path}; drop one of them"
            )
        mix = poisson_arrivals(mix, workload.rate, seed)
    if not workload.serving:
        raise WorkloadError("workload.serving is empty; give at least one of " + ", ".join(SERVING_MODES))
    for mode in workload.serving:
        if mode not in SERVING_MODES:
            raise WorkloadError(f"workload.serving: unknown mode {mode!r}; allowed: {', '.join(SERVING_MODES)}")
    ttft, tpot = (slo.ttft_ms, slo.tpot_ms) if slo is not None else (0.0, 0.0)
    return WorkloadSpec(workload.name or source, mix, min(workload.warmup_requests, len(mix)), source, ttft, tpot)
