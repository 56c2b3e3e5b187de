"""The host's preparation gate: nothing heavy starts on a CPU host while a cell there is measured.

A file lock per Ray session and host. Whatever prepares (a spare importing, a template starting)
holds it exclusively; a cell's measured phase holds it shared. Standard library only: the cell's
actor and its forked process both use it without importing torch.
"""

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator


def gate_path(session_name: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"kvsweep-gate-{session_name}.lock")


@contextlib.contextmanager
def host_gate(path: str, exclusive: bool) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
