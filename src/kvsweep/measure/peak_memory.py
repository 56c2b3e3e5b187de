"""Peak memory of one measured call: device (the accelerator's allocator) and host (resident set).

Both are *this* call's: `PeakMemoryMeter` resets each high-water mark right before it, and the caller makes sure
nothing of an earlier call (cache, outputs, logits) is alive then, or every repeat reports more. The host peak is
the kernel's VmHWM, reset through /proc/self/clear_refs and read back to prove it; it catches spikes a sampling
thread would miss, at no cost during the call. Where the kernel refuses the reset a sampling thread stands in and
`host_method` says so. Freed memory the C allocator keeps stays resident (as in a server); malloc_trim before each
call was tried and dropped: every prefill page-faulted afresh (+11% TTFT) and the jitter stayed.
"""

import re
import threading
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
    """The accelerator's allocator, as the meter needs it (CUDA in production, a fake in tests)."""

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


@dataclass(frozen=True)
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


class PeakMemoryMeter:
    """The call meter of peak memory (`Meter[PeakMemory]`): `start` resets the high-water marks right before
    the call, `stop` reads them after it. `device`: the accelerator's allocator (None: host only).

    A call that raises is never read: `abandon` then ends the sampling thread, if one stands in.
    """

    def __init__(self, device: DeviceMemory | None) -> None:
        self.device = device
        self.sampler: RssSampler | None = None
        self.host_method = HWM

    def start(self) -> None:
        if self.device is not None:
            self.device.synchronize()
            self.device.reset_peak()
        problem = reset_host_peak()
        self.sampler, self.host_method = None, HWM
        if problem is not None:
            self.host_method = f"{SAMPLED} every {SAMPLE_INTERVAL_S * 1e3:g} ms ({problem})"
            self.sampler = RssSampler()
            self.sampler.start()

    def stop(self) -> PeakMemory:
        if self.sampler is None:
            status = _read_status()
            host = status[0] if status else 0
        else:
            host, self.sampler = self.sampler.stop(), None
        if self.device is None:
            return PeakMemory(host, host_method=self.host_method)
        self.device.synchronize()
        largest = self.device.peak_bytes()
        each = self.device.peaks() if isinstance(self.device, CudaMemory) and self.device.gpus > 1 else None
        return PeakMemory(host, largest, each, self.host_method)

    def abandon(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None


class RssSampler:
    """The stand-in for the kernel's mark (`Meter[int]`): a thread samples the resident set every
    `SAMPLE_INTERVAL_S` from `start` to `stop`, which returns the largest seen, in bytes."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.best = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(SAMPLE_INTERVAL_S):
            self.best = max(self.best, self.process.memory_info().rss)

    def start(self) -> None:
        self.best = self.process.memory_info().rss
        self.thread.start()

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        self.best = max(self.best, self.process.memory_info().rss)
        return self.best
