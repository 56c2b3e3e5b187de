"""Ctrl-C and SIGTERM for the driver: both end a sweep the same, orderly way."""

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised by `SignalInterrupts`."""


class SignalInterrupts:
    """While entered, SIGINT and SIGTERM raise `Interrupted`, and the signal that came is remembered.

    The exception alone cannot say which: Ray's blocking calls (`ray.wait`, `ray.get`) catch any
    KeyboardInterrupt raised inside them and raise a bare one instead.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum)
        raise Interrupted(self.received.name)

    def __enter__(self) -> "SignalInterrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    @property
    def name(self) -> str:
        return (self.received or signal.SIGINT).name  # a KeyboardInterrupt no signal of ours raised: as Ctrl-C

    @property
    def exit_code(self) -> int:
        """The shell's convention, 128 + the signal's number: 130 after Ctrl-C, 143 after SIGTERM."""
        return 128 + (self.received or signal.SIGINT)


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """A second Ctrl-C must not cut the cleanup after the first one short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
