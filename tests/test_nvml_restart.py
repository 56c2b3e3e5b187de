"""A forked cell starts NVML afresh: the NVML a forkserver left initialised is shut down, then started.

The stand-in for NVML's bindings (`fake_nvml.py`) keeps the library's reference count and says whose
state is live; a forked process inherits the forkserver's count and state. The forked cell's own record
of it (`environment.nvml`) is checked on stand-in cells in test_cpu_slots.py, and on a GPU by
scripts/gpu_smoke.sh.
"""

from fake_nvml import FakeGpu, FakeNvml
from kvsweep.cell.process import FAILED, RESTARTED, restart_nvml


def test_the_forkservers_nvml_is_replaced_by_this_processs_own():
    # torch's NVML device count in the forkserver: three inits, never shut down, inherited by the fork.
    inherited = FakeNvml([FakeGpu("GPU-a")], held=3, started_by="forkserver")
    assert restart_nvml(inherited) == RESTARTED
    assert inherited.started_by == "this process" and inherited.held == 1 and inherited.inits == 1


def test_a_process_whose_nvml_was_never_started_starts_it():
    fresh = FakeNvml([FakeGpu("GPU-a")])
    assert restart_nvml(fresh) == RESTARTED
    assert fresh.held == 1 and fresh.started_by == "this process"


def test_nvml_that_cannot_start_says_why():
    assert restart_nvml(FakeNvml([], starts=False)) == f"{FAILED}: NVMLError_DriverNotLoaded: Driver Not Loaded"


def test_without_a_driver_the_real_bindings_say_why_and_raise_nothing():
    found = restart_nvml()  # this machine: pynvml installed, no NVML library
    assert found.startswith(f"{FAILED}: ") and "\n" not in found
