"""NVML started anew in a forked cell's process, before the cell reads its GPUs through it.

The template's forkserver counts devices through NVML (torch's NVML-based `is_available`) and never shuts
it down, so every process forked from it inherits an NVML that is initialised in name only: its state
was built in another process, and NVML is not made to survive a fork. A call to `nvmlInit` in the child
only counts one more user of that state. So the cell shuts NVML down until it says it is not initialised
(once per `nvmlInit` the forkserver made, plus one for the init that loads the library into pynvml),
then starts it afresh. What came of it goes into the cell's environment (`nvml`), where the GPU smoke
run checks it.
"""

import importlib
from typing import Any

RESTARTED = "restarted"
FAILED = "failed to start"
MOST_SHUTDOWNS = 64  # far more inits than the forkserver makes; beyond it, something else holds NVML


def restart_nvml(nvml: Any = None) -> str:
    """`RESTARTED`, or `failed to start: why`. `nvml`: the bindings (`pynvml` unless given: the seam for tests)."""
    try:
        nvml = nvml or importlib.import_module("pynvml")
    except ImportError:
        return f"{FAILED}: pynvml is not installed"
    try:
        nvml.nvmlInit()  # loads the library into pynvml (torch loaded it apart), one more user of the old state
    except nvml.NVMLError as exc:
        return f"{FAILED}: {type(exc).__name__}: {exc}"
    for _ in range(MOST_SHUTDOWNS):
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:  # not initialised any more: the inherited state is gone
            break
    else:
        return f"{FAILED}: NVML was still initialised after {MOST_SHUTDOWNS} shutdowns"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"{FAILED}: {type(exc).__name__}: {exc}"
    return RESTARTED
