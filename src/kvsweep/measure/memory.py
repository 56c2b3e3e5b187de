"""Peak memory of one measured call: device (CUDA allocator) and host (resident set).

Host peak uses the kernel's own high-water mark (VmHWM), reset through /proc/self/clear_refs, so it
catches spikes a sampling thread would miss and costs nothing during the call. Where the kernel
does not allow the reset, a sampling thread stands in.
"""

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
SAMPLE_INTERVAL_S = 0.002


@dataclass
class PeakMemory:
    host_rss_bytes: int = 0
    device_bytes: int | None = None  # None off CUDA


def _read_hwm() -> int | None:
    try:
        match = re.search(r"VmHWM:\s+(\d+)\s+kB", _STATUS.read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _read_hwm() is not None


@contextmanager
def track_peak_memory(cuda: bool) -> Iterator[PeakMemory]:
    peak = PeakMemory()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if _reset_hwm():
        yield peak
        peak.host_rss_bytes = _read_hwm() or 0
    else:
        with _sample_rss() as sampled:
            yield peak
        peak.host_rss_bytes = sampled[0]
    if cuda:
        torch.cuda.synchronize()
        peak.device_bytes = torch.cuda.max_memory_allocated()


@contextmanager
def _sample_rss() -> Iterator[list[int]]:
    process = psutil.Process()
    best = [process.memory_info().rss]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_INTERVAL_S):
            best[0] = max(best[0], process.memory_info().rss)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield best
    finally:
        done.set()
        thread.join()
        best[0] = max(best[0], process.memory_info().rss)
