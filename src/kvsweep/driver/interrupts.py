"""Ctrl-C and SIGTERM for the driver: both end a sweep the same, orderly way."""

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        raise Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
