"""When this process started, to the clock tick: the start of every cell's timeline."""

import os
import time
from pathlib import Path


def process_started_at() -> float:
    """Wall-clock start of this process from /proc (psutil's create_time is only good to a second)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
