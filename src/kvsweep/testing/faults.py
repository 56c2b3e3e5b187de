"""Test-only fault injection, selected by config (`testing.faults`).

A fault fires from inside `generate` (as a logits processor on the first new token), so the error
travels the same path a real one would: a real `torch.OutOfMemoryError`, a real hang, a real
process exit. `cuda_init` replaces CUDA's initialisation when the cell starts its device. With no
faults configured nothing here runs.
"""

import os
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import LogitsProcessor

from kvsweep.testing.testing_config import Fault, default_phase

# torch's own words when the driver is older than the CUDA the build needs (c10/cuda's driver check).
DRIVER_TOO_OLD = (
    "The NVIDIA driver on your system is too old (found version 12040). Please update your GPU driver by "
    "downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
    "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with your "
    "version of the CUDA driver. (injected by test)"
)


def fault_for(cell: dict[str, Any], faults: list[dict[str, Any]], during: str = "measure") -> Fault | None:
    """The first fault for this phase whose `match` fields all equal the cell's."""
    for fault in faults:
        if (fault.get("during") or default_phase(fault["fault"])) != during:
            continue
        if all(str(cell.get(key)) == str(value) for key, value in fault.get("match", {}).items()):
            return Fault(fault["fault"], float(fault.get("ms_per_token") or 0.0))
    return None


def cuda_init_for(fault: Fault | None) -> Callable[[], None] | None:
    """What starts CUDA in place of `torch.cuda.init` for the `start` phase's fault (None: CUDA's own)."""
    return _driver_too_old if fault is not None and fault.kind == "cuda_init" else None


def _driver_too_old() -> None:
    raise RuntimeError(DRIVER_TOO_OLD)


class InjectFault(LogitsProcessor):
    """A `slow` fault runs before the token clock, so its sleep falls inside each token's time: TTFT holds
    one sleep and so does every gap between two tokens, as if every forward pass had got slower. The
    others run after the clock."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault.kind
        self.sleep_s = fault.ms_per_token / 1000
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.fault == "slow":
            time.sleep(self.sleep_s)
        if self.fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by test)")
        if self.fault == "error":
            raise ValueError("injected error")
        if self.fault == "hang":
            while True:
                time.sleep(1)
        if self.fault == "exit":
            os._exit(17)
        if self.fault == "recompile":  # drop compiled graphs once per call: the next step compiles again
            self.prompt_length = self.prompt_length or input_ids.shape[1]
            if input_ids.shape[1] == self.prompt_length:
                torch._dynamo.reset()
        return scores
