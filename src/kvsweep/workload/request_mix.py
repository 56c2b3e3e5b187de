"""A request mix: the requests every KV cache strategy replays, in order, so their numbers compare like for like.

A mix is data, not a generator: its `sha256` lets two sweeps prove they replayed the very same requests even when
they drew them on different machines or read them from different copies of a trace.
"""

import hashlib
import json
import math
from dataclasses import dataclass


class WorkloadError(ValueError):
    """A bad workload (config, length spec or trace line), told in one line that names what was wrong."""

    def __init__(self, message: str) -> None:
        # One line always: the command line prints it as is, and a trace line's text could carry a newline.
        super().__init__(" ".join(str(message).splitlines()))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Request:
    """One request: how long its prompt is, how many tokens it generates, and when it arrives (None: at once)."""

    input_tokens: int
    output_tokens: int
    arrival_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if not _positive_int(value):
                raise WorkloadError(f"request {name} must be a positive integer, got {value!r}")
        arrival = self.arrival_s
        if arrival is not None and not (_finite_number(arrival) and arrival >= 0):
            raise WorkloadError(f"request arrival_s must be a finite number >= 0, got {arrival!r}")

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class RequestMix:
    """The requests of a workload, in replay (arrival) order; `name` says where they came from, for people."""

    name: str
    requests: tuple[Request, ...]

    def __post_init__(self) -> None:
        if not self.requests:
            raise WorkloadError(f"workload {self.name!r} has no requests")

    @property
    def sha256(self) -> str:
        """The requests' fingerprint: canonical JSON (sorted keys, compact, in order); the name is not part of it."""
        rows = [
            {"arrival_s": r.arrival_s, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens}
            for r in self.requests
        ]
        text = json.dumps(rows, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def offered_rate(self) -> float | None:
        """Requests a second its arrival times offer: (n - 1) gaps over the first to the last arrival (a Poisson
        mix's rate, as drawn); None in a closed loop, or with every request at once."""
        last = self.requests[-1].arrival_s
        return (len(self.requests) - 1) / last if last else None

    @property
    def longest_input(self) -> int:
        return max(r.input_tokens for r in self.requests)

    @property
    def longest_total(self) -> int:
        """The most positions one request needs (prompt + output): what a static cache must hold for it."""
        return max(r.total_tokens for r in self.requests)

    @property
    def input_lengths(self) -> tuple[int, ...]:
        """The distinct prompt lengths, ascending: one prefill shape each for a compiled cache."""
        return tuple(sorted({r.input_tokens for r in self.requests}))

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    def __len__(self) -> int:
        return len(self.requests)
