"""Peak memory of one measured call: device (the accelerator's allocator) and host (resident set).

Both peaks are the peak of *this* call: the tracker resets each high-water mark right before the
call, and the caller makes sure nothing of an earlier call (cache, outputs, logits) is still alive
then — otherwise the reset starts from what earlier calls left and every repeat reports more.

Host peak uses the kernel's own high-water mark (VmHWM), reset through /proc/self/clear_refs and
read back to prove the reset took effect; it catches spikes a sampling thread would miss and costs
nothing during the call. Where the kernel refuses the reset, a sampling thread stands in and the
result says so (`host_method`), never silently. Freed memory the C allocator keeps stays resident
(as in a server); handing it back before each call (malloc_trim) was tried and dropped: it made
every prefill page-fault afresh, +11% TTFT against a bare loop, and left the jitter of a growing
cache as it was.
"""

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
SAMPLE_INTERVAL_S = 0.002
# After a reset VmHWM equals VmRSS; allow the few pages the read itself may touch.
RESET_SLACK_BYTES = 1 << 20
HWM = "vmhwm"
SAMPLED = "sampled"


class DeviceMemory(Protocol):
    """The accelerator's allocator, as the tracker needs it (CUDA in production, a fake in tests)."""

    def synchronize(self) -> None: ...

    def reset_peak(self) -> None: ...

    def peak_bytes(self) -> int: ...


class CudaMemory:
    """`torch.cuda.max_memory_allocated` semantics: the peak since the last reset, in bytes, of each of the
    cell's `gpus` GPUs (a model split over several: `peak_bytes` is the largest, `peaks` each one's)."""

    def __init__(self, gpus: int = 1) -> None:
        self.gpus = gpus

    def synchronize(self) -> None:
        import torch

        for gpu in range(self.gpus):
            torch.cuda.synchronize(gpu)

    def reset_peak(self) -> None:
        import torch

        for gpu in range(self.gpus):
            torch.cuda.reset_peak_memory_stats(gpu)

    def peaks(self) -> list[int]:
        import torch

        return [int(torch.cuda.max_memory_allocated(gpu)) for gpu in range(self.gpus)]

    def peak_bytes(self) -> int:
        return max(self.peaks())


@dataclass
class PeakMemory:
    host_rss_bytes: int = 0
    device_bytes: int | None = None  # None without an accelerator; over several GPUs, the largest
    device_bytes_each: list[int] | None = None  # over several GPUs: each one's peak, in the cell's GPU order
    host_method: str = HWM  # HWM, or SAMPLED with the reason the kernel's mark could not be reset


def _read_status() -> tuple[int, int] | None:
    """(VmHWM, VmRSS) in bytes, read in one go so they describe the same instant."""
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    hwm, rss = re.search(r"VmHWM:\s+(\d+)\s+kB", text), re.search(r"VmRSS:\s+(\d+)\s+kB", text)
    if hwm is None or rss is None:
        return None
    return int(hwm.group(1)) * 1024, int(rss.group(1)) * 1024


def reset_host_peak() -> str | None:
    """Resets VmHWM to the current RSS; returns None when the read-back proves it, else why not."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError as exc:
        return f"clear_refs refused ({type(exc).__name__})"
    status = _read_status()
    if status is None:
        return "VmHWM unreadable"
    hwm, rss = status
    if hwm > rss + RESET_SLACK_BYTES:
        return f"VmHWM stayed {(hwm - rss) >> 20} MiB above RSS after the reset"
    return None


@contextmanager
def track_peak_memory(device: DeviceMemory | None) -> Iterator[PeakMemory]:
    peak = PeakMemory()
    if device is not None:
        device.synchronize()
        device.reset_peak()
    problem = reset_host_peak()
    if problem is None:
        yield peak
        status = _read_status()
        peak.host_rss_bytes = status[0] if status else 0
    else:
        peak.host_method = f"{SAMPLED} every {SAMPLE_INTERVAL_S * 1e3:g} ms ({problem})"
        with _sample_rss() as sampled:
            yield peak
        peak.host_rss_bytes = sampled[0]
    if device is not None:
        device.synchronize()
        peak.device_bytes = device.peak_bytes()
        if isinstance(device, CudaMemory) and device.gpus > 1:
            peak.device_bytes_each = device.peaks()


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
