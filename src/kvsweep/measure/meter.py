"""The one shape of every meter: `start` before what it measures, `stop` after, which returns a plain reading.

A call meter brackets each measured call (the host's CPUs in `contention.py`, a call's energy in
`energy.py`, a call's peak memory in `peak_memory.py`); a phase meter brackets the whole measured phase
(who else is on the GPUs in `gpu_sharing.py`, the phase's energy). `phase_meters.py` composes them around
the measured phase; the peak memory is read inside `GenerateSession.call`, around `generate` alone.
"""

from typing import Protocol, TypeVar

Reading = TypeVar("Reading", covariant=True)


class Meter(Protocol[Reading]):
    """Brackets one stretch of work: `start` before it, `stop` after it, returning what was read."""

    def start(self) -> None: ...

    def stop(self) -> Reading: ...
