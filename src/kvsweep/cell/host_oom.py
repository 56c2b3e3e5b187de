"""Was a process killed for host memory? The kernel's OOM kills counted by this process's cgroup.

A forked cell process that dies by SIGKILL is a host OOM when the cgroup's `oom_kill` counter rose
while it ran (cgroup v2 `memory.events`, v1 `memory.oom_control`). None when no counter is readable.
"""

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":  # cgroup v2
            count = _field(root / relative / "memory.events", "oom_kill")
        elif "memory" in controllers.split(","):
            count = _field(root / "memory" / relative / "memory.oom_control", "oom_kill")
        else:
            continue
        if count is not None:
            return count
    return None


def _field(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        return None
    return None
