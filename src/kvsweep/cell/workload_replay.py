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
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


@dataclass
class Replay:
    """A replay's requests and what its calls found (memory and KV bytes at their largest)."""

    requests: list[RequestTimes]
    span_s: float  # the first arrival to the last request's end
    calls: list[MeasuredCall]


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
    for first in range(0, len(requests), rows):
        group = list(range(first, min(first + rows, len(requests))))
        due = [a for a in (arrivals[i] for i in group) if a is not None]
        if due:
            _wait_until(max(due))  # a batch goes when its last request has arrived
        longest = max(requests[i].input_tokens for i in group)
        ids = torch.full((len(group), longest), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(group):  # left padding, as generate pads a batch
            ids[row, longest - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, longest - len(prompts[i]) :] = 1
        new = max(requests[i].output_tokens for i in group)
        sent = time.perf_counter()
        call = session.call_request(strategy, ids.to(device), mask.to(device), new)
        check(call)
        calls.append(call)
        # offsets from the call's clock; what came before it (the call's config, the memory meter) is the request's
        setup = (session.clock.start_ns * 1e-9 - sent) * 1e3
        stamps = [setup + t for t in _token_offsets_ms(call)]
        for row, i in enumerate(group):
            arrived = arrivals[i] if arrivals[i] is not None else sent
            queue_ms = (sent - arrived) * 1e3
            own = stamps[: requests[i].output_tokens]
            tpot = (own[-1] - own[0]) / (len(own) - 1) if len(own) > 1 else None
            timed.append(
                RequestTimes(
                    requests[i].input_tokens,
                    requests[i].output_tokens,
                    requests[i].arrival_s,
                    queue_ms + own[0],
                    tpot,
                    queue_ms + own[-1],
                    queue_ms,
                    tuple(call.new_tokens[row, : requests[i].output_tokens].tolist()),
                )
            )
    return Replay(timed, time.perf_counter() - start, calls)


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
        stamps = out.timestamps  # type: ignore[attr-defined]
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
