"""Per-token timestamps from inside `generate`.

`generate` calls each logits processor once per new token, right after the forward pass that
produced that token's logits. Stamping the clock there gives time-to-first-token (prefill) and the
gaps between tokens (decode) from one call, never by subtracting a separate prefill run.
"""

import inspect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor


def _no_sync() -> None:
    pass


class TokenClock(LogitsProcessor):
    """Records a timestamp (ns) per generated token; `sync` (the device's synchronize) runs first so
    queued accelerator work is counted in the token it belongs to."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync or _no_sync
        self.start_ns = 0
        self.stamps_ns: list[int] = []

    def start(self) -> None:
        self.sync()
        self.stamps_ns = []
        self.start_ns = time.perf_counter_ns()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.sync()
        self.stamps_ns.append(time.perf_counter_ns())
        return scores

    # transformers' LogitsProcessorList calls inspect.signature(processor.__call__) on every token;
    # a precomputed signature makes that ~3x cheaper (set below the class).

    def stop(self) -> int:
        """Ends the call; returns its end time (ns)."""
        self.sync()
        return time.perf_counter_ns()


TokenClock.__call__.__signature__ = inspect.signature(TokenClock.__call__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class TokenTimes:
    """One generate call, in milliseconds."""

    ttft_ms: float
    gaps_ms: list[float]  # one per decoded token after the first
    e2e_ms: float

    @property
    def decode_ms(self) -> float:
        return sum(self.gaps_ms)

    @property
    def tpot_ms(self) -> float:
        return self.decode_ms / len(self.gaps_ms) if self.gaps_ms else float("nan")

    @classmethod
    def from_clock(cls, start_ns: int, stamps_ns: list[int], end_ns: int) -> "TokenTimes":
        if not stamps_ns:
            raise RuntimeError("generate produced no tokens; nothing to time")
        ms = 1e-6
        gaps = [(b - a) * ms for a, b in itertools.pairwise(stamps_ns)]
        return cls((stamps_ns[0] - start_ns) * ms, gaps, (end_ns - start_ns) * ms)
