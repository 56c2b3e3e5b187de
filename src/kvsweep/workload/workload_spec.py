"""A sweep's workload as every cell receives it: the mix itself (not a recipe), its name and how it is replayed.

The driver draws the mix once from `workload.*` (a seeded length distribution, a trace, or the user's prompts
file) and ships the requests with the protocol, so every cell of every node replays the very same requests; a cell
id hashes the mix by its sha256. A model with fewer positions than a drawn request gets the same requests with
their prompts shortened to fit (`fitted`), the same way in the planner and in the cell; a trace's request or a
file's prompt that does not fit is refused.

A prompts file's requests are text: how many tokens each prompt is depends on the model's tokenizer, so the
driver encodes them once per model (`WorkloadPrompts.lengths`) and `mix_for(model)` is that model's mix.

`workload.rate` is an axis: the spec holds the mix without Poisson arrivals, and a cell at rate r replays
`mix_for(model, r)`, its arrivals drawn from the sweep's seed alone, so every cache at one rate is offered the very
same requests at the very same times (and each rate the same exponential draws, scaled).
"""

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvsweep.inputs.prompt_file import read_prompt_file
from kvsweep.workload.mix_sources import (
    LengthSpec,
    file_outputs,
    lengths_mix,
    parse_length_spec,
    poisson_arrivals,
    trace_mix,
)
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError

LENGTHS, FILE, TRACE = "lengths", "file", "trace"
SOURCES = (LENGTHS, FILE, TRACE)
SEQUENTIAL, BATCHED, CONTINUOUS = "sequential", "batched", "continuous"
SERVING_MODES = (SEQUENTIAL, BATCHED, CONTINUOUS)


@dataclass(frozen=True)
class WorkloadPrompts:
    """A prompts-file workload's text (`workload.source=file`): request i is `records[i]`, framed as
    `inputs.chat_template` says, and its answer (when the file gives one) is scored on what the request generated."""

    file_name: str
    file_sha256: str
    records: tuple[dict[str, Any], ...]  # as `inputs.prompt_file` reads them: prompt or messages, answer?, line
    chat_template: bool
    lengths: dict[str, tuple[int, ...]] = field(default_factory=dict)  # model -> each prompt's tokens, as encoded

    def identity(self) -> dict[str, Any]:
        """What makes a file's requests the same ones: its bytes, how many of its prompts, and the framing."""
        return {"file_sha256": self.file_sha256, "prompts": len(self.records), "chat_template": self.chat_template}


@dataclass(frozen=True)
class WorkloadSpec:
    """The mix (arrival times set when it has them), its short name (the cells' `workload` param) and how many of
    its first requests are replayed once before the measured replay of all of them (a cold prefill shape, a first
    compile: not counted)."""

    name: str
    mix: RequestMix
    warmup_requests: int
    source: str  # lengths | file | trace: for the dry run and the docs' wording
    slo_ttft_ms: float = 0.0  # `slo.*`: what a request must meet to count as goodput (0: not applied)
    slo_tpot_ms: float = 0.0
    prompts: WorkloadPrompts | None = None  # source=file: the text; `mix` then holds outputs and arrivals only
    seed: int = 0  # what `workload.rate`'s Poisson arrivals are drawn with (`measure.seed`)

    def mix_for(self, model: str, rate: float = 0.0) -> RequestMix:
        """The requests as `model` runs them (a prompts file's prompts at the length its tokenizer gives them),
        arriving as a Poisson process of `rate` requests a second when it is above 0 (a cell's `rate`)."""
        mix = self.mix
        if self.prompts is not None:
            lengths = self.prompts.lengths.get(model)
            if lengths is None:
                raise WorkloadError(f"workload.path {self.prompts.file_name}: its prompts were not encoded for {model}")
            pairs = zip(lengths, self.mix.requests, strict=True)
            mix = RequestMix(self.mix.name, tuple(Request(n, r.output_tokens, r.arrival_s) for n, r in pairs))
        return poisson_arrivals(mix, rate, self.seed) if rate > 0 else mix

    def arrivals_sha256(self, rate: float) -> str:
        """What a cell at `rate` replays, as a cell id hashes it: the mix with that rate's arrival times."""
        return poisson_arrivals(self.mix, rate, self.seed).sha256

    def with_lengths(self, lengths: dict[str, tuple[int, ...]]) -> "WorkloadSpec":
        """This spec with each model's prompt lengths (a prompts file's; unchanged for other sources)."""
        return self if self.prompts is None else replace(self, prompts=replace(self.prompts, lengths=dict(lengths)))

    @property
    def open_loop(self) -> bool:
        """The mix's own arrival times (a trace's; `workload.rate`'s are a cell's): TTFT then includes waiting
        for a free slot."""
        return self.mix.requests[0].arrival_s is not None

    def identity(self) -> dict[str, Any]:
        identity = {
            "name": self.name,
            "sha256": self.mix.sha256,
            "warmup_requests": self.warmup_requests,
            "slo": [self.slo_ttft_ms, self.slo_tpot_ms],
        }
        return identity | ({"prompts": self.prompts.identity()} if self.prompts else {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": [asdict(r) for r in self.mix.requests],
            "mix_name": self.mix.name,
            "warmup_requests": self.warmup_requests,
            "source": self.source,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
            "prompts": asdict(self.prompts) if self.prompts else None,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WorkloadSpec":
        mix = RequestMix(data["mix_name"], tuple(Request(**r) for r in data["requests"]))
        prompts = data.get("prompts")
        if prompts:
            lengths = {model: tuple(n) for model, n in prompts["lengths"].items()}
            prompts = WorkloadPrompts(**{**prompts, "records": tuple(prompts["records"]), "lengths": lengths})
        return cls(
            data["name"],
            mix,
            data["warmup_requests"],
            data["source"],
            data["slo_ttft_ms"],
            data["slo_tpot_ms"],
            prompts or None,
            data.get("seed", 0),
        )


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


def workload_from_config(workload: Any, seed: int, slo: Any = None, chat_template: bool = True) -> WorkloadSpec | None:
    """`cfg.workload` as a spec, or None when no workload is set (the grid's own axes). Raises WorkloadError in one
    line for anything wrong with it: an unknown source, a bad length spec, a trace line (a prompts file's mistake
    is the ConfigError its reader raises). A prompts file's lengths are not known here: `with_lengths`."""
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
    elif source == FILE:
        prompts, mix = _file_workload(workload, seed, chat_template)
    else:
        if not workload.path:
            raise WorkloadError("workload.source=trace needs workload.path (a JSONL of input_tokens, output_tokens)")
        mix = trace_mix(workload.path, workload.requests, max_positions=None)
    offered = [r for r in rate_axis(workload.rate) if r > 0]
    if offered and mix.requests[0].arrival_s is not None:
        given = ",".join(f"{r:g}" for r in offered)
        raise WorkloadError(
            f"workload.rate=[{given}] would replace the arrival times of {workload.path}; drop one of them"
        )
    if not workload.serving:
        raise WorkloadError("workload.serving is empty; give at least one of " + ", ".join(SERVING_MODES))
    for mode in workload.serving:
        if mode not in SERVING_MODES:
            raise WorkloadError(f"workload.serving: unknown mode {mode!r}; allowed: {', '.join(SERVING_MODES)}")
    ttft, tpot = (slo.ttft_ms, slo.tpot_ms) if slo is not None else (0.0, 0.0)
    warmup = min(workload.warmup_requests, len(mix))
    name = workload.name or source
    return WorkloadSpec(name, mix, warmup, source, ttft, tpot, prompts if source == FILE else None, seed)


def rate_axis(rate: Any) -> list[float]:
    """`workload.rate` as the cells' axis: each rate once, in the config's order; [0] (closed loop) when empty."""
    return list(dict.fromkeys(float(r) for r in rate)) or [0.0]


def _file_workload(workload: Any, seed: int, chat_template: bool) -> tuple[WorkloadPrompts, RequestMix]:
    """The file's first `workload.requests` prompts (fewer when it has fewer) and their drawn output lengths."""
    if not workload.path:
        raise WorkloadError("workload.source=file needs workload.path (a .jsonl or .txt file of prompts)")
    if not workload.output_lengths:
        raise WorkloadError("workload.source=file needs workload.output_lengths (e.g. fixed:64): tokens each answer")
    read = read_prompt_file(workload.path, key="workload.path")
    records = read.records[: workload.requests]
    output = parse_length_spec(workload.output_lengths, "workload.output_lengths")
    mix = file_outputs(f"file {read.name}", output, len(records), seed)
    return WorkloadPrompts(read.name, read.sha256, records, chat_template), mix
