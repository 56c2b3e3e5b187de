"""Errors that the command line turns into exit codes, and how any error is told in one line."""


class ConfigError(ValueError):
    """A bad config or command line: reported in one line before Ray starts (exit code 2)."""


class ClusterError(RuntimeError):
    """The cluster cannot run the grid (e.g. the grid needs GPUs it does not have)."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (its type when it has none), for one-line reports."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(exc).__name__
