"""Reading an exception as "out of memory": the one place, for the cell's run and its quality check."""

import torch


def out_of_memory(exc: BaseException, device: str) -> str | None:
    """Which memory ran out ("device" or "host"), or None: the one place an exception is read as OOM.

    torch raises `OutOfMemoryError` for CUDA; other allocators (the CPU's, some CUDA paths inside
    extensions) raise a plain `RuntimeError` whose message is the only sign. Python's `MemoryError` is
    its own allocator's failure, always in host memory (a CPU cell's data-segment limit raises it too).
    """
    if isinstance(exc, torch.OutOfMemoryError):
        return "device"
    if isinstance(exc, MemoryError):
        return "host"
    message = str(exc).lower()
    if isinstance(exc, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message):
        return "device" if device == "cuda" else "host"
    return None
