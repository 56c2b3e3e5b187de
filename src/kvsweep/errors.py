"""Errors that the command line turns into exit codes."""


class ConfigError(ValueError):
    """A bad config or command line: reported in one line before Ray starts (exit code 2)."""


class ClusterError(RuntimeError):
    """The cluster cannot run the grid (e.g. the grid needs GPUs it does not have)."""
