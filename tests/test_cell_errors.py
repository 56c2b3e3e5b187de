"""A cell that fails anywhere in its process reports why, as an `error` result with the message.

The case that matters on a GPU node: CUDA cannot start (a driver older than the torch build). The
`cuda_init` fault makes CUDA's initialisation raise torch's own "driver too old" error, on any host.
"""

import os
import pickle
import socket
from pathlib import Path

import cloudpickle
import pytest
import torch

from conftest import cell_runs
from kvsweep.cell.process import NO_RESULT
from kvsweep.cell.request import CellRequest
from kvsweep.cell.run_cell import record_failure
from kvsweep.errors import ConfigError
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.results import ERROR, OK, CellResult
from kvsweep.testing.testing_config import seams_from
from kvsweep.tracking.journal import Journal
from kvsweep_testkit.cells import measure_cell

CELL = Cell("tiny-llama", "float32", 64, 1, 4, "dynamic", False)
PROTOCOL = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
DRIVER_TOO_OLD = "The NVIDIA driver on your system is too old"  # torch's words, which the fault repeats
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
NVML_CHECK_BEFORE = os.environ.get(NVML_CHECK)  # this process's own setting, before any template
ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"  # a sticky error, in CUDA's words


def test_cuda_that_cannot_start_is_an_error_with_its_reason_and_the_host_found_so_far():
    faults = seams_from({"faults": [{"fault": "cuda_init"}]}).faults
    result = measure_cell(CELL.to_dict(), PROTOCOL.to_dict(), faults)
    assert result["status"] == "error"
    assert "CUDA" in result["error"] and DRIVER_TOO_OLD in result["error"], result["error"]
    assert DRIVER_TOO_OLD in result["traceback"]
    environment = result["environment"]  # the host's part was found before the device failed
    assert environment["hostname"] == socket.gethostname()
    assert environment["torch_version"] == torch.__version__
    assert "device_name" not in environment  # the device was never described: it never started
    assert not result["metrics"]  # nothing was measured


def test_cuda_init_fires_when_the_cell_starts_its_device_and_nowhere_else():
    assert seams_from({"faults": [{"fault": "cuda_init"}]}).faults[0]["during"] == "start"
    assert seams_from({"faults": [{"fault": "oom"}]}).faults[0]["during"] == "measure"
    with pytest.raises(ConfigError, match=r"testing.faults\[0\].during: cuda_init fires when the cell starts"):
        seams_from({"faults": [{"fault": "cuda_init", "during": "measure"}]})
    with pytest.raises(ConfigError, match=r"testing.faults\[0\].during: error fires inside generate"):
        seams_from({"faults": [{"fault": "error", "during": "start"}]})


def _request(**testing) -> bytes:
    """What a cell's actor sends its template (`CellActor._forked`), cloudpickled."""
    request = {
        "request": CellRequest(CELL, PROTOCOL, seams=seams_from(testing)),
        "env": {"CUDA_VISIBLE_DEVICES": None, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": None},
        "cpus": sorted(os.sched_getaffinity(0)),
        "owner_pid": os.getpid(),
        "gate_path": "",
    }
    return cloudpickle.dumps(request)


def _environ_names(pid: int) -> set[str]:
    """The variables a process started with, read by the kernel (`/proc/PID/environ`)."""
    return {entry.split(b"=", 1)[0].decode() for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")}


@pytest.fixture(scope="module")
def template():
    """A warm template in this process (its forkserver is real). The template keeps the NVML setting in its
    own process (its Ray actor, on a node); here this process gets its own back as soon as the forkserver
    has started with it, so that no later test runs with it."""
    from kvsweep.cell.template import CellTemplate

    before = os.environ.get(NVML_CHECK)
    try:
        started = CellTemplate()  # its forkserver starts here, inheriting the setting
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before
    return started


class Unprintable(Exception):
    """An exception whose message itself raises: not even the cell's error result can be written."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


def unprintable_cell(request: CellRequest) -> dict:
    """A stand-in runner (`testing.runner=test_cell_errors:unprintable_cell`) that fails that way."""
    raise Unprintable()


@pytest.mark.slow
def test_whatever_fails_in_a_forked_cell_comes_back_as_its_error_never_an_exit_code(template):
    # CUDA that cannot start: the cell's error says why (before: exit code 1, `crashed`, retried)
    reply = template.measure(_request(faults=[{"fault": "cuda_init"}]))
    assert reply["exitcode"] == 0
    assert reply["result"]["status"] == "error" and DRIVER_TOO_OLD in reply["result"]["error"]
    assert reply["result"]["environment"]["forked"]["pid"] == reply["pid"]  # measured in the forked process

    # outside `run_cell`: a runner that is not there
    reply = template.measure(_request(runner="kvsweep.testing.stand_ins:no_such_runner"))
    assert reply["exitcode"] == 0
    assert reply["result"]["status"] == "error" and "no_such_runner" in reply["result"]["error"]
    assert reply["result"]["cell"] == CELL.to_dict()

    # not even the cell can be read: the answer still says why
    reply = template.measure(pickle.dumps({"request": CELL.to_dict()})[:-8])  # cut short
    assert reply["exitcode"] == 0
    assert "could not be read" in reply["result"][NO_RESULT]

    # not even the error result can be built: the last resort still says what was raised
    reply = template.measure(_request(runner="test_cell_errors:unprintable_cell"))
    assert reply["exitcode"] == 0
    message = reply["result"][NO_RESULT]
    assert "could not be built or sent" in message and "while reporting Unprintable" in message, message


def test_a_failure_whose_device_memory_cannot_be_freed_is_still_the_cells_own_error():
    """After a sticky CUDA error every CUDA call raises it again, `empty_cache` included: the release
    must not replace the cell's error (before: it escaped `run_cell` and the process exited 1)."""
    released = []

    def sticky_release() -> None:
        released.append(True)
        raise RuntimeError(ILLEGAL_ACCESS)

    result = CellResult("c", CELL, OK)
    record_failure(result, ERROR, ValueError("injected error"), release_device_memory=sticky_release)
    assert released == [True]  # the release was tried, and raised
    assert result.status == ERROR and result.error == "ValueError: injected error"
    assert "injected error" in result.traceback and ILLEGAL_ACCESS not in result.traceback


@pytest.mark.slow
def test_the_cell_drops_the_templates_nvml_shortcut_before_anything_asks_about_cuda(template):
    assert NVML_CHECK in _environ_names(template.state["forkserver_pid"])  # the template keeps it
    assert os.environ.get(NVML_CHECK) == NVML_CHECK_BEFORE  # and this process has its own back
    reply = template.measure(_request(runner="kvsweep.testing.stand_ins:environ_cell"))
    assert reply["result"]["status"] == "ok", reply["result"]["error"]
    names = set(reply["result"]["environment"]["environ_names"])
    assert "OMP_NUM_THREADS" in names  # the reading works: a variable the request set is seen
    assert NVML_CHECK not in names


def test_a_sweeps_cell_whose_cuda_cannot_start_is_an_error_on_its_first_attempt(run_sweep):
    run = run_sweep("grid.caches=[dynamic]", "+testing.faults=[{fault:cuda_init}]")
    assert run.code == 1, run.out + run.err
    (result,) = Journal(run.run_dir).read().results
    assert result.status == "error" and result.attempt == 1  # not `crashed`, not retried
    assert "CUDA" in result.error and DRIVER_TOO_OLD in result.error
    _, (child,) = cell_runs(run.tracking_uri)
    assert child.data.tags["kvsweep.status"] == "error" and child.data.tags["kvsweep.attempt"] == "1"
    assert DRIVER_TOO_OLD in child.data.tags["kvsweep.error"]
