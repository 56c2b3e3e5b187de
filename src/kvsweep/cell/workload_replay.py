"""Replay a request mix through one cache and serving mode, timing every request from when it arrived.

Closed loop (no arrival times): a request arrives when the one before it (sequential), its batch's turn
(batched) or a free slot (continuous) lets it in. Open loop (a trace's times or Poisson arrivals): it arrives at
its time after the replay starts and is sent as soon as the server has room (sequential: the one before it done;
batched: its whole batch arrived and the batch before it done; continuous: a free slot), and TTFT and end-to-end
time include that wait (`queue_ms`).

`generate` serves sequential and batched modes: a batch of B consecutive requests is left-padded to its longest
prompt, as `generate` pads, and runs to its longest output; each row's own times end at its own last token.
Continuous batching (the `paged` strategy) serves every mode through one manager: one request in flight
(sequential), B at a time and wait (batched), or up to B in flight, refilled as each finishes (continuous).

Compile seconds are the server's seconds (`compile_seconds`): each `generate` call's time from being sent to its
end (`service_ms`, waiting for arrivals left out), summed over the cold replay, less that sum over the measured
replay. Not the replays' spans: under open-loop arrivals both follow the arrival schedule, and a compile stall that
fits in an idle gap vanishes from them. Not closed-loop replays for the compile alone: a warm one would be a third
replay, for what the calls' times already give. Not Dynamo's own accounting (`torch._dynamo.utils.compile_times`):
it leaves out what the first calls pay outside the compiler (kernels Inductor builds on first use, CUDA graph
recording). The replay knows when it sent each call and when the call ended: a server second is one it was busy.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvsweep.caches import CacheStrategy
from kvsweep.cell.generate_session import GenerateSession, MeasuredCall
from kvsweep.workload.request_mix import Request
from kvsweep.workload.workload_spec import BATCHED, SEQUENTIAL

PAD_ID = 0


@dataclass(frozen=True)
class RequestTimes:
    """One request as the mix's client saw it, in milliseconds from its arrival."""

    input_tokens: int
    output_tokens: int
    arrival_s: float | None
    ttft_ms: float
    tpot_ms: float | None  # None for a one-token output
    e2e_ms: float
    queue_ms: float  # arrival to being sent: 0 in a closed loop
    tokens: tuple[int, ...] = ()  # what it generated (greedy): the report compares them with dynamic's
    # `generate` serving (None under continuous batching, where requests share steps): the call that served it
    # (a batch's rows share it) and that call's time from being sent to its end, arrival waits excluded
    call: int | None = None
    service_ms: float | None = None


@dataclass
class Replay:
    """A replay's requests and what its calls found (memory and KV bytes at their largest)."""

    requests: list[RequestTimes]
    span_s: float  # the first arrival to the last request's end
    calls: list[MeasuredCall]
    call_s: list[float] = field(default_factory=list)  # each `generate` call's server seconds (`service_ms`)


class TokenStampError(RuntimeError):
    """A request's token stamps or tokens do not number its output: its times would not be its tokens'."""


def compile_seconds(cold: Replay, warm: Replay) -> float:
    """The cold replay's server seconds beyond the warm one's, over the same calls: what compiling cost the
    server, whatever gaps between arrivals it fell into (never below 0: noise can make a cold replay quicker)."""
    if len(cold.call_s) != len(warm.call_s):
        raise ValueError(f"a cold replay of {len(cold.call_s)} calls against a warm one of {len(warm.call_s)}")
    return max(0.0, sum(cold.call_s) - sum(warm.call_s))


def prompt_ids(requests: Sequence[Request], vocab: int, seed: int) -> list[list[int]]:
    """Each request's prompt: random ids (the same for every strategy of the sweep), as random-fed cells get."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (r.input_tokens,), generator=generator).tolist() for r in requests]


def _wait_until(moment: float) -> None:
    while (left := moment - time.perf_counter()) > 0:
        time.sleep(min(left, 0.05))


def _arrivals(requests: Sequence[Request], start: float) -> list[float | None]:
    return [None if r.arrival_s is None else start + r.arrival_s for r in requests]


def replay_generate(
    session: GenerateSession,
    strategy: CacheStrategy,
    requests: Sequence[Request],
    prompts: Sequence[list[int]],
    serving: str,
    batch: int,
    check: Callable[[MeasuredCall], None],
) -> Replay:
    """Sequential (B = 1) or batched serving through `generate`; `check` sees every call (the cache's identity)."""
    rows = 1 if serving == SEQUENTIAL else batch
    device = session.inputs.device
    start = time.perf_counter()
    arrivals = _arrivals(requests, start)
    timed: list[RequestTimes] = []
    calls: list[MeasuredCall] = []
    call_s: list[float] = []
    for first in range(0, len(requests), rows):
        group = list(range(first, min(first + rows, len(requests))))
        due = [a for a in (arrivals[i] for i in group) if a is not None]
        if due:
            _wait_until(max(due))  # a batch goes when its last request has arrived
        ids, mask = _left_padded([prompts[i] for i in group])
        new = max(requests[i].output_tokens for i in group)
        sent = time.perf_counter()
        call = session.call_request(strategy, ids.to(device), mask.to(device), new)
        check(call)
        calls.append(call)
        # offsets from the call's clock; what came before it (the call's config, the memory meter) is the request's
        setup = (session.clock.start_ns * 1e-9 - sent) * 1e3
        stamps = [setup + t for t in _token_offsets_ms(call)]
        service_ms = setup + call.times.e2e_ms  # sent to the call's end: the server's time, one per call
        call_s.append(service_ms / 1e3)
        for row, i in enumerate(group):
            queue_ms = (sent - arrivals[i]) * 1e3 if arrivals[i] is not None else 0.0
            tokens = tuple(call.new_tokens[row, : requests[i].output_tokens].tolist())
            timed.append(_row_times(requests[i], queue_ms, stamps, tokens, len(calls) - 1, service_ms))
    return Replay(timed, time.perf_counter() - start, calls, call_s)


def _left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's ids and mask, every prompt left-padded to the longest, as generate pads a batch."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    return ids, mask


def _row_times(
    request: Request, queue_ms: float, stamps: list[float], tokens: tuple[int, ...], call: int, service_ms: float
) -> RequestTimes:
    """One row of a call: its times end at its own last token (`stamps`: the call's, from the call being sent)."""
    own = stamps[: request.output_tokens]
    tpot = (own[-1] - own[0]) / (len(own) - 1) if len(own) > 1 else None
    return RequestTimes(
        request.input_tokens,
        request.output_tokens,
        request.arrival_s,
        queue_ms + own[0],
        tpot,
        queue_ms + own[-1],
        queue_ms,
        tokens,
        call,
        service_ms,
    )


def _token_offsets_ms(call: MeasuredCall) -> list[float]:
    """Each generated token's time from the call's start."""
    offsets = [call.times.ttft_ms]
    for gap in call.times.gaps_ms:
        offsets.append(offsets[-1] + gap)
    return offsets


def _ready(
    waiting: list[int], in_flight: set[int], arrivals: list[float | None], limit: int, serving: str
) -> list[int]:
    """The requests to send now: up to the free slots of those arrived; a batch only whole (all B arrived, none
    in flight), as the generate path sends it."""
    now = time.perf_counter()
    arrived = [i for i in waiting if arrivals[i] is None or arrivals[i] <= now]
    if serving == BATCHED:
        group = waiting[:limit]
        return group if not in_flight and all(i in arrived for i in group) else []
    return [i for i in waiting[: limit - len(in_flight)] if i in arrived]


def in_flight_limit(serving: str, batch: int) -> int:
    return 1 if serving == SEQUENTIAL else batch


def replay_paged(
    manager_requests: Callable[[list[tuple[str, list[int], int]]], None],
    results: Callable[[float | None], object],
    requests: Sequence[Request],
    prompts: Sequence[list[int]],
    serving: str,
    batch: int,
    tag: str,
) -> tuple[list[RequestTimes], float]:
    """Every mode through continuous batching: `manager_requests` adds (id, prompt, new tokens) requests,
    `results(timeout)` waits for the next finished output (None when the timeout passes first: a request that
    arrives meanwhile is sent at its time, not when another finishes). Per-request times come from the manager's
    own stamps."""
    limit = in_flight_limit(serving, batch)
    start = time.perf_counter()
    arrivals = _arrivals(requests, start)
    sent_at: dict[int, float] = {}
    done: dict[int, RequestTimes] = {}
    waiting = list(range(len(requests)))
    in_flight: set[int] = set()
    while len(done) < len(requests):
        ready = _ready(waiting, in_flight, arrivals, limit, serving)
        if ready:
            now = time.perf_counter()
            for i in ready:
                sent_at[i] = now
                waiting.remove(i)
                in_flight.add(i)
            manager_requests([(f"{tag}-{i}", prompts[i], requests[i].output_tokens) for i in ready])
            continue
        if not in_flight:  # the next request (a batch: its last one) has not arrived yet
            group = waiting[:limit] if serving == BATCHED else waiting[:1]
            _wait_until(max((a for a in (arrivals[i] for i in group) if a is not None), default=time.perf_counter()))
            continue
        upcoming = [arrivals[i] for i in waiting if arrivals[i] is not None]
        room = serving != BATCHED and len(in_flight) < limit
        out = results(max(0.0, min(upcoming) - time.perf_counter()) if upcoming and room else None)
        if out is None:
            continue
        index = int(str(out.request_id).rsplit("-", 1)[1])  # type: ignore[attr-defined]
        in_flight.discard(index)
        stamps = _numbered_stamps(out, requests[index].output_tokens)
        arrived = arrivals[index] if arrivals[index] is not None else sent_at[index]
        queue_ms = (sent_at[index] - arrived) * 1e3
        tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3 if len(stamps) > 1 else None
        r = requests[index]
        done[index] = RequestTimes(
            r.input_tokens,
            r.output_tokens,
            r.arrival_s,
            (stamps[0] - arrived) * 1e3,
            tpot,
            (stamps[-1] - arrived) * 1e3,
            queue_ms,
            tuple(out.generated_tokens),  # type: ignore[attr-defined]
        )
    return [done[i] for i in range(len(requests))], time.perf_counter() - start


def _numbered_stamps(out: Any, asked: int) -> list[float]:
    """A finished request's token stamps, one per output token it asked for (and as many tokens): else the cell
    fails, since its TTFT and TPOT would be some other count's."""
    stamps, tokens = list(out.timestamps or ()), list(out.generated_tokens or ())
    if len(stamps) != asked or len(tokens) != asked:
        raise TokenStampError(
            f"continuous batching returned request {out.request_id} with {len(stamps)} token stamps and "
            f"{len(tokens)} tokens for the {asked} output tokens it asked for: its times would not be its tokens'"
        )
    return stamps
