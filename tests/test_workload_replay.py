"""The replay's scheduling of requests and its server seconds, against stand-in servers whose clock the test sets.

The continuous-batching stand-in finishes each request a fixed time after it is sent and stamps its tokens then;
the `generate` stand-in sleeps a known time per token, and its first call of each shape sleeps a known "compile"
time more. What is checked is when the replay sends each request (its arrival or a free slot) and what it counts
as the server's seconds, against hand arithmetic on those times, not how fast anything generates.
"""

import itertools
import time
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from kvsweep.cell.workload_replay import (
    Replay,
    TokenStampError,
    compile_seconds,
    replay_generate,
    replay_paged,
)
from kvsweep.measure.sampling import TokenTimes
from kvsweep.report.compile_payback import call_times
from kvsweep.workload.latency_stats import compile_payback
from kvsweep.workload.request_mix import Request

SERVICE_S = 0.4  # the stand-in server takes this long for any request


class StandInServer:
    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.done: set[str] = set()

    def add(self, items: list[tuple[str, list[int], int]]) -> None:
        for request_id, _, _ in items:
            self.sent[request_id] = time.perf_counter()

    def result(self, timeout: float | None) -> object:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            now = time.perf_counter()
            for request_id, sent in sorted(self.sent.items(), key=lambda kv: kv[1]):
                if request_id not in self.done and now >= sent + SERVICE_S:
                    self.done.add(request_id)
                    stamps = [sent + SERVICE_S / 2, sent + SERVICE_S]
                    return SimpleNamespace(request_id=request_id, timestamps=stamps, generated_tokens=[1, 2])
            if deadline is not None and now >= deadline:
                return None
            time.sleep(0.005)


def test_a_request_arriving_while_another_is_served_is_sent_at_its_arrival_when_a_slot_is_free():
    """Two slots; the second request arrives 0.1 s in, while the first is being served (0.4 s): it goes at
    0.1 s, so it waits nothing. One slot (sequential): it waits for the first to finish, 0.3 s of queue."""
    requests = [Request(8, 2, 0.0), Request(8, 2, 0.1)]
    for serving, batch, queued in (("continuous", 2, 0.0), ("sequential", 1, SERVICE_S - 0.1)):
        server = StandInServer()
        timed, _ = replay_paged(server.add, server.result, requests, [[1] * 8] * 2, serving, batch, tag="t")
        assert timed[1].queue_ms == pytest.approx(queued * 1e3, abs=40), serving
        assert timed[1].ttft_ms == pytest.approx((queued + SERVICE_S / 2) * 1e3, abs=40), serving


def test_a_request_whose_token_stamps_do_not_number_its_output_fails_the_replay():
    """A request asked for 3 tokens; the manager stamped 2: its TPOT would be over the wrong count of gaps."""

    server = StandInServer()  # stamps 2 tokens whatever was asked
    with pytest.raises(TokenStampError, match=r"request t-0 with 2 token stamps and 2 tokens for the 3 output tokens"):
        replay_paged(server.add, server.result, [Request(8, 3)], [[1] * 8], "sequential", 1, tag="t")


STEP_S = 0.005  # the compiled stand-in's time per token: a call of 2 tokens takes 10 ms
EAGER_STEP_S = 0.03  # dynamic's: 60 ms a call
COMPILE_S = 0.0625  # each new shape's extra time on its first call


class GenerateStandIn:
    """What `replay_generate` calls of a `GenerateSession`: `inputs`, `clock.start_ns` and `call_request`, whose
    call sleeps `step_s` per token, and first `compile_s` more for a shape of ids it has not seen."""

    def __init__(self, step_s: float, compile_s: float = 0.0) -> None:
        self.inputs = torch.zeros(1, 1, dtype=torch.long)
        self.clock = SimpleNamespace(start_ns=0)
        self.step_s, self.compile_s = step_s, compile_s
        self.shapes: set[tuple[int, ...]] = set()

    def call_request(self, strategy: object, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> object:
        self.clock.start_ns = time.perf_counter_ns()
        started = self.clock.start_ns * 1e-9
        if self.compile_s and tuple(ids.shape) not in self.shapes:
            self.shapes.add(tuple(ids.shape))
            time.sleep(self.compile_s)
        stamps = []
        for _ in range(new_tokens):
            time.sleep(self.step_s)
            stamps.append(time.perf_counter())
        ms = [(t - started) * 1e3 for t in stamps]
        times = TokenTimes(ms[0], [b - a for a, b in itertools.pairwise(ms)], (time.perf_counter() - started) * 1e3)
        return SimpleNamespace(times=times, new_tokens=torch.ones(ids.shape[0], new_tokens, dtype=torch.long))


def replay(session: GenerateStandIn, requests: list[Request], serving: str = "sequential", batch: int = 1) -> Replay:
    checked = []
    done = replay_generate(
        session, None, requests, [[1] * r.input_tokens for r in requests], serving, batch, checked.append
    )  # type: ignore[arg-type]
    assert len(checked) == len(done.calls)  # every call was checked
    return done


def mix(inputs: list[int], gap_s: float | None) -> list[Request]:
    """Requests of 2 output tokens; `gap_s` apart from 0 (open loop), or None (closed loop)."""
    return [Request(n, 2, None if gap_s is None else i * gap_s) for i, n in enumerate(inputs)]


def test_a_request_arriving_while_the_server_is_busy_waits_for_it_through_generate():
    """Sequential, each call 2 x 50 ms: the first request goes at 0 and is done at 0.1 s; the second arrived at
    0.03 s and waits 70 ms, its first token 50 ms after it is sent; the third arrives at 0.4 s to an idle server
    and waits nothing."""
    session = GenerateStandIn(step_s=0.05)
    requests = [Request(8, 2, 0.0), Request(8, 2, 0.03), Request(8, 2, 0.4)]
    timed = replay(session, requests).requests
    assert timed[0].queue_ms == pytest.approx(0, abs=15)
    assert timed[1].queue_ms == pytest.approx(70, abs=25)
    assert timed[1].ttft_ms == pytest.approx(70 + 50, abs=30)
    assert timed[1].e2e_ms == pytest.approx(70 + 100, abs=35)
    assert timed[2].queue_ms == pytest.approx(0, abs=15)
    # the server's time is the call's alone: about 100 ms each, whatever the request waited
    assert [r.service_ms for r in timed] == [pytest.approx(100, abs=25)] * 3


def test_a_batch_goes_when_its_last_request_arrives_and_the_batch_before_it_is_done():
    """Batches of 2, calls of 2 x 50 ms. Batch 1 (arrivals 0 and 0.04 s) goes at 0.04: its first request waited
    40 ms. Batch 2 (0.05 and 0.06 s) arrives while batch 1 runs (0.04 to 0.14 s): sent at 0.14, its requests
    waited 90 and 80 ms. Both rows of a call share its first token and its server time."""
    session = GenerateStandIn(step_s=0.05)
    requests = [Request(8, 2, 0.0), Request(8, 2, 0.04), Request(8, 2, 0.05), Request(8, 2, 0.06)]
    timed = replay(session, requests, "batched", 2).requests
    assert [r.queue_ms for r in timed] == [
        pytest.approx(40, abs=20),
        pytest.approx(0, abs=15),
        pytest.approx(90, abs=25),
        pytest.approx(80, abs=25),
    ]
    assert [r.call for r in timed] == [0, 0, 1, 1]
    assert timed[0].ttft_ms - timed[0].queue_ms == timed[1].ttft_ms - timed[1].queue_ms
    assert timed[0].service_ms == timed[1].service_ms == pytest.approx(100, abs=25)


def compile_and_warm(inputs: list[int], gap_s: float | None, serving: str = "sequential", batch: int = 1):
    """A compiled stand-in's cold replay and measured (warm) replay of the mix; dynamic's replay of it."""
    compiled = GenerateStandIn(STEP_S, COMPILE_S)
    requests = mix(inputs, gap_s)
    cold = replay(compiled, requests, serving, batch)
    warm = replay(compiled, requests, serving, batch)
    dynamic = replay(GenerateStandIn(EAGER_STEP_S), requests, serving, batch)
    return cold, warm, dynamic


def payback_of(compile_s: float, warm: Replay, dynamic: Replay) -> int | None:
    """The payback from the request records as the cell writes them, read as the report reads them."""
    mine, theirs = call_times([asdict(r) for r in warm.requests]), call_times([asdict(r) for r in dynamic.requests])
    assert mine is not None and theirs is not None and mine[1] == theirs[1]
    return compile_payback(compile_s, mine[0], theirs[0], mine[1])


def test_compile_seconds_are_the_servers_whether_requests_arrive_open_or_closed_loop():
    """Prompts of 8 and 16 tokens: two shapes, each compiling 62.5 ms once: 125 ms of compiling. Closed loop, and
    open loop with arrivals 0.1 s apart (each stall, 62.5 + 10 ms, fits in the gap before the next arrival, so the
    cold replay's span is the warm one's: a span difference would find nothing), count the same 125 ms."""
    inputs = [8, 16, 8, 16, 8, 16]
    closed = compile_and_warm(inputs, None)
    opened = compile_and_warm(inputs, 0.1)
    for cold, warm, _ in (closed, opened):
        assert compile_seconds(cold, warm) == pytest.approx(2 * COMPILE_S, abs=0.025)
    assert compile_seconds(*closed[:2]) == pytest.approx(compile_seconds(*opened[:2]), abs=0.025)
    assert opened[0].span_s - opened[1].span_s < 0.04  # what the replays' spans would have said


@pytest.mark.parametrize("gap_s", [None, 0.02])
def test_sequential_payback_counts_each_requests_server_time_saved(gap_s):
    """Each request takes the compiled server 2 x 5 ms, dynamic 2 x 30 ms: 50 ms saved a request. 125 ms of
    compiling: 50 and 100 ms after two requests fall short, 150 after the third repay it: 3 requests. Open loop
    (arrivals 20 ms apart), dynamic's 60 ms requests queue 40 ms longer each: that waiting is no work the server
    did, and the payback is the same (end-to-end savings, 50 then 90 ms, would have said 2)."""
    cold, warm, dynamic = compile_and_warm([8, 16, 8, 16, 8, 16], gap_s)
    compiled_s = compile_seconds(cold, warm)
    assert payback_of(compiled_s, warm, dynamic) == 3
    if gap_s is not None:  # dynamic's last request waited for the five before it: not counted above
        assert dynamic.requests[-1].queue_ms == pytest.approx(5 * 40, abs=40)


def test_batched_payback_counts_one_saving_per_call():
    """Batches of 2 with prompts (8, 8), (16, 16), (8, 8): two shapes, 125 ms of compiling. A call of 2 tokens saves
    50 ms (10 against 60 ms) whatever its rows: 50, 100, then 150 ms after the third call repays it, with its rows:
    6 requests. Counting a call's saving once per row would have said 3."""
    cold, warm, dynamic = compile_and_warm([8, 8, 16, 16, 8, 8], None, "batched", 2)
    compiled_s = compile_seconds(cold, warm)
    assert compiled_s == pytest.approx(2 * COMPILE_S, abs=0.025)
    assert payback_of(compiled_s, warm, dynamic) == 6
