"""Errors that the command line turns into exit codes, how any error is told in one line, and which memory an
error says ran out."""


class ConfigError(ValueError):
    """A bad config or command line: reported in one line before Ray starts (exit code 2)."""


class ClusterError(RuntimeError):
    """The cluster cannot run the grid (e.g. the grid needs GPUs it does not have)."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (its type when it has none), for one-line reports."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(exc).__name__


def out_of_memory(exc: BaseException, device: str) -> str | None:
    """Which memory ran out ("device" or "host"), or None: the one place an exception is read as OOM.

    torch raises `OutOfMemoryError` for CUDA; other allocators (the CPU's, some CUDA paths inside
    extensions) raise a plain `RuntimeError` whose message is the only sign. Python's `MemoryError` is
    its own allocator's failure, always in host memory (a CPU cell's data-segment limit raises it too).
    """
    import torch  # here, not above: the driver reports errors too and never loads torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "device"
    if isinstance(exc, MemoryError):
        return "host"
    message = str(exc).lower()
    if isinstance(exc, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message):
        return "device" if device == "cuda" else "host"
    return None
