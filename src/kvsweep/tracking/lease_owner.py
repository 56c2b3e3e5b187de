"""Who holds a sweep's lease on its parent run, and whether that process is alive, asked without MLflow.

A lease names its owner by host, pid and a random token, plus the process's kernel identity (boot id,
pid namespace, start time). A reader on the same kernel and pid namespace can then tell at once
whether the owner still runs: a dead pid, or a pid since reused by another process, is a dead owner.
Anywhere else (another host, another container) it cannot, and watches the heartbeat instead
(`lease.py`). Standard library only: the driver imports `LeaseHeld` before MLflow is loaded.
"""

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    token: str  # tells two owners apart where host and pid are the same (a pid reused, two leases in one process)
    process: str = ""  # "<boot id>/<pid namespace>/<start time>": empty where /proc cannot say

    @classmethod
    def here(cls) -> "Owner":
        """This process, with a token of its own."""
        return cls(socket.gethostname(), os.getpid(), secrets.token_hex(8), process_identity(os.getpid()))

    def tag(self) -> str:
        return f"host={self.host} pid={self.pid} token={self.token} process={self.process}"

    @classmethod
    def parse(cls, text: str) -> "Owner | None":
        """The owner a tag names; None for a tag kvsweep did not write."""
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        try:
            return cls(fields["host"], int(fields["pid"]), fields["token"], fields.get("process", ""))
        except (KeyError, ValueError):
            return None

    def alive_here(self) -> bool | None:
        """True/False where this process shares the owner's kernel and pid namespace; None where it cannot tell."""
        here = process_identity(os.getpid())
        if not self.process or not here or here.rsplit("/", 1)[0] != self.process.rsplit("/", 1)[0]:
            return None
        return process_identity(self.pid) == self.process


def process_identity(pid: int) -> str:
    """`<boot id>/<pid namespace>/<start time>` of a running process ("" where it is gone, a zombie, or no /proc).

    The start time (clock ticks since boot) tells a process from a later one that got its pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and parentheses
    state, started = fields[0], fields[19]
    if state in ("Z", "X"):  # killed, not yet reaped: dead
        return ""
    return f"{boot}/{namespace}/{started}"


class LeaseHeld(Exception):
    """Another live sweep writes to the parent run this sweep would resume: refused, exit 2."""

    def __init__(self, sweep: str, run_id: str, owner: Owner | None, why: str = "") -> None:
        self.sweep, self.run_id, self.owner, self.why = sweep, run_id, owner, why
        super().__init__(str(self))

    def __str__(self) -> str:
        who = f"on host {self.owner.host} (pid {self.owner.pid})" if self.owner else "elsewhere"
        parent = f", writing to parent run {self.run_id}" if self.run_id else ""
        why = f" ({self.why})" if self.why else ""
        return (
            f"sweep {self.sweep} is already running {who}{parent}{why}; "
            "not measuring its cells twice: run the same command again once it ends to resume, "
            "or add rerun=true to start a parent run of its own"
        )
