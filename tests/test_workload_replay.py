"""The replay's scheduling of requests, against a stand-in server whose clock the test controls.

The stand-in finishes each request a fixed time after it is sent and stamps its tokens then; what is checked is
when the replay sends each request (its arrival or a free slot), not how fast anything generates.
"""

import time
from types import SimpleNamespace

import pytest

from kvsweep.cell.workload_replay import replay_paged
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
