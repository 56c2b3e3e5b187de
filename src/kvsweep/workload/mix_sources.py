"""Where a request mix comes from: length distributions drawn with a seed, or a trace file of real requests.

Draws use `random.Random(seed)` alone (never numpy's or the global state), and only its `random()`: Python promises
that sequence for a seed across versions and machines, not those of `randint`, `lognormvariate` or `expovariate`, so
lengths and gaps are made from it by inversion. One seed gives the same mix, and the same `RequestMix.sha256`, on any
machine.

A length distribution in a config is one string (`parse_length_spec`):

    fixed:128,512,2048              these lengths in turn, cycled over the requests (a bare `128,512` is the same)
    uniform:64-512                  any integer from 64 to 512, both included, equally likely
    lognormal:median=256,p99=2048   a long tail like real prompts: half below 256, 1% above 2048 (rounded, >= 1)

A trace is JSONL, one request a line (blank lines skipped):

    {"input_tokens": 812, "output_tokens": 97, "arrival_s": 0.0}

`arrival_s` is optional (on every line or on none) and must not decrease; times are made relative to the first
request. A public serving trace converts in a few lines, e.g. the Azure LLM inference trace (columns TIMESTAMP,
ContextTokens, GeneratedTokens; timestamps like `2023-11-16 18:15:46.6805900`):

    import csv, json
    from datetime import datetime

    with open("AzureLLMInferenceTrace_conv.csv", newline="") as rows, open("azure_conv.jsonl", "w") as out:
        for row in csv.DictReader(rows):
            if int(row["ContextTokens"]) > 0 and int(row["GeneratedTokens"]) > 0:  # a few rows generate nothing
                when = datetime.fromisoformat(row["TIMESTAMP"] + "+00:00")  # UTC: no daylight-saving jumps
                line = {"input_tokens": int(row["ContextTokens"]), "output_tokens": int(row["GeneratedTokens"]),
                        "arrival_s": when.timestamp()}  # trace_mix makes it relative to the first request
                out.write(json.dumps(line) + "\\n")
"""

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

from kvsweep.errors import first_line
from kvsweep.workload.request_mix import Request, RequestMix, WorkloadError

Z_99 = 2.3263478740408408  # the standard normal's 99th percentile: ln(p99 / median) = Z_99 * sigma
STANDARD_NORMAL = NormalDist()


def _unit(rng: random.Random) -> float:
    """A uniform draw in (0, 1): `random()` alone, redrawn on its one value (0.0) an inverse CDF cannot take."""
    while (u := rng.random()) == 0.0:
        pass
    return u


@dataclass(frozen=True)
class FixedLengths:
    """These lengths in turn: the i-th request gets values[i % len(values)]; draws nothing."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in self.values):
            raise WorkloadError(f"fixed lengths must be positive integers, got {list(self.values)}")

    def draw(self, rng: random.Random, index: int) -> int:
        return self.values[index % len(self.values)]

    def __str__(self) -> str:
        return "fixed:" + ",".join(str(v) for v in self.values)


@dataclass(frozen=True)
class UniformLengths:
    """Any integer from `low` to `high`, both included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise WorkloadError(f"uniform lengths need 1 <= low <= high, got {self.low}-{self.high}")

    def draw(self, rng: random.Random, index: int) -> int:
        span = self.high - self.low + 1
        return self.low + min(math.floor(_unit(rng) * span), span - 1)  # min: u * span can round up to span

    def __str__(self) -> str:
        return f"uniform:{self.low}-{self.high}"


@dataclass(frozen=True)
class LognormalLengths:
    """Lengths whose logarithm is normal, given as the two numbers people know of a trace: its median and p99."""

    median: float
    p99: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and math.isfinite(self.p99) and 1 <= self.median <= self.p99):
            raise WorkloadError(f"lognormal lengths need 1 <= median <= p99, got median={self.median} p99={self.p99}")

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def sigma(self) -> float:
        return math.log(self.p99 / self.median) / Z_99

    def draw(self, rng: random.Random, index: int) -> int:
        return max(1, round(math.exp(self.mu + self.sigma * STANDARD_NORMAL.inv_cdf(_unit(rng)))))

    def __str__(self) -> str:
        return f"lognormal:median={self.median:g},p99={self.p99:g}"


LengthDist = FixedLengths | UniformLengths | LognormalLengths


@dataclass(frozen=True)
class LengthSpec:
    """How long prompts are and how many tokens each request generates, drawn independently."""

    input: LengthDist
    output: LengthDist


def _integer(token: str) -> int:
    token = token.strip()
    if not token.lstrip("-").isdigit():
        raise ValueError(f"{token!r} is not an integer")
    return int(token)


def _lognormal(body: str) -> LognormalLengths:
    fields: dict[str, float] = {}
    for part in body.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in ("median", "p99") or name in fields:
            raise ValueError("write lognormal:median=<tokens>,p99=<tokens>")
        fields[name] = float(value)
    if set(fields) != {"median", "p99"}:
        raise ValueError("write lognormal:median=<tokens>,p99=<tokens>")
    return LognormalLengths(median=fields["median"], p99=fields["p99"])


def parse_length_spec(text: str, key: str) -> LengthDist:
    """A length distribution from its config string (see the module docstring); errors name `key` and the text."""
    kind, sep, body = str(text).strip().partition(":")
    kind = kind.strip().lower()
    if not sep:  # a bare list of lengths: fixed
        kind, body = "fixed", kind
    try:
        if kind == "fixed":
            return FixedLengths(tuple(_integer(v) for v in body.split(",")))
        if kind == "uniform":
            low, dash, high = body.strip().partition("-")
            if not dash:
                raise ValueError("write uniform:<low>-<high>")
            return UniformLengths(_integer(low), _integer(high))
        if kind == "lognormal":
            return _lognormal(body)
    except (ValueError, WorkloadError) as exc:
        raise WorkloadError(f"{key} {text!r}: {first_line(exc)}") from None
    raise WorkloadError(f"{key} {text!r}: unknown distribution {kind!r} (fixed:, uniform: or lognormal:)")


def _check_count(requests: int | None, allow_none: bool = True) -> None:
    if requests is None and allow_none:
        return
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise WorkloadError(f"workload.requests must be a positive integer, got {requests!r}")


def lengths_mix(spec: LengthSpec, requests: int, seed: int, max_positions: int | None) -> RequestMix:
    """`requests` requests drawn from `spec` (input then output for each, in order), fitted to the model.

    A request longer than `max_positions` keeps its output and loses prompt tokens (never below 1): the output
    length is what decode is timed over. An output that alone fills the positions cannot be fitted: an error.
    """
    _check_count(requests, allow_none=False)
    rng = random.Random(seed)
    drawn = []
    for index in range(requests):
        prompt, output = spec.input.draw(rng, index), spec.output.draw(rng, index)
        if max_positions is not None:
            if output >= max_positions:
                raise WorkloadError(
                    f"an output of {output} tokens ({spec.output}) leaves no room for a prompt "
                    f"in the model's {max_positions} positions"
                )
            prompt = min(prompt, max_positions - output)
        drawn.append(Request(prompt, output))
    name = f"lengths input={spec.input} output={spec.output} requests={requests} seed={seed}"
    return RequestMix(name=name, requests=tuple(drawn))


def file_outputs(name: str, output: LengthDist, requests: int, seed: int) -> RequestMix:
    """A prompts file's requests before a tokenizer has read them: each output length drawn from `output` with
    the seed, and a prompt length of 1 standing in until the prompts are encoded for a model
    (`WorkloadSpec.mix_for`)."""
    _check_count(requests, allow_none=False)
    rng = random.Random(seed)
    drawn = tuple(Request(1, output.draw(rng, index)) for index in range(requests))
    return RequestMix(name=f"{name} output={output} requests={requests} seed={seed}", requests=drawn)


def _trace_length(row: dict, name: str, where: str) -> int:
    if name not in row:
        raise WorkloadError(f"{where}: no {name}")
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{where}: {name} must be a positive integer, got {json.dumps(value)}")
    return value


def _trace_arrival(row: dict, where: str, previous: float | None) -> float:
    value = row["arrival_s"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{where}: arrival_s must be a number of seconds, got {json.dumps(value)}")
    if value < 0:
        raise WorkloadError(f"{where}: arrival_s must not be negative, got {value}")
    if previous is not None and value < previous:
        raise WorkloadError(f"{where}: arrival_s {value} is before the previous request's {previous}")
    return float(value)


def trace_mix(path: str, requests: int | None, max_positions: int | None) -> RequestMix:
    """The first `requests` requests of a JSONL trace (all with None); fewer when the file has fewer: check len().

    Lines after the last request taken are not parsed (the file is read whole), so a malformed tail past them is
    not an error.
    """
    _check_count(requests)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"workload.path {path}: cannot read it ({first_line(exc)})") from None
    taken: list[Request] = []
    arrivals: list[float] = []
    timed: bool | None = None  # whether the trace gives arrival times: decided by its first request
    for number, line in enumerate(text.split("\n"), start=1):
        if requests is not None and len(taken) >= requests:
            break
        if not line.strip():
            continue
        where = f"workload.path {path} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise WorkloadError(f"{where}: not a JSON object")
        prompt, output = _trace_length(row, "input_tokens", where), _trace_length(row, "output_tokens", where)
        if max_positions is not None and prompt + output > max_positions:
            raise WorkloadError(
                f"{where}: input_tokens + output_tokens = {prompt + output} is beyond the model's "
                f"{max_positions} positions"
            )
        has_arrival = "arrival_s" in row and row["arrival_s"] is not None
        if timed is None:
            timed = has_arrival
        elif has_arrival != timed:
            first = "has one" if timed else "has none"
            raise WorkloadError(f"{where}: arrival_s must be on every line or on none (the first request {first})")
        if has_arrival:
            arrivals.append(_trace_arrival(row, where, arrivals[-1] if arrivals else None))
        taken.append(Request(prompt, output))
    if not taken:
        raise WorkloadError(f"workload.path {path}: no requests in it")
    if arrivals:
        start = arrivals[0]
        taken = [Request(r.input_tokens, r.output_tokens, t - start) for r, t in zip(taken, arrivals, strict=True)]
    return RequestMix(name=f"trace {Path(path).name}", requests=tuple(taken))


def poisson_arrivals(mix: RequestMix, rate_per_s: float, seed: int) -> RequestMix:
    """The same requests arriving as a Poisson process: exponential gaps of mean 1/rate, first at 0.

    Open-loop arrivals like a real service's: a request never waits for the one before it to be sent. The process
    is taken given its last arrival at (n - 1)/rate (the drawn gaps scaled to sum to it; the others then fall as a
    Poisson process's do, as sorted uniforms): a short mix offers exactly the rate asked, rather than a draw's luck
    (32 gaps' sum varies by 18%), so cells at several rates, and their saturation, read against the rates set.
    """
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int | float) or not 0 < rate_per_s < math.inf:
        raise WorkloadError(f"workload.rate must be a positive number, got {rate_per_s!r}")
    rng = random.Random(f"kvsweep-arrivals:{seed}")  # not the lengths' stream: gaps independent of lengths
    gaps = [-math.log(_unit(rng)) for _ in mix.requests[1:]]  # inverse of the exponential CDF, mean 1
    scale = (len(gaps) / rate_per_s) / sum(gaps) if gaps else 0.0
    now, timed = 0.0, []
    for index, request in enumerate(mix.requests):
        if index:
            now += gaps[index - 1] * scale
        timed.append(Request(request.input_tokens, request.output_tokens, now))
    return RequestMix(name=f"{mix.name} poisson rate={rate_per_s:g}/s seed={seed}", requests=tuple(timed))
