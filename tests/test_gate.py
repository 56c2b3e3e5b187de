"""The host's gate as a cell's phases drive it: held shared from "measuring" to "measured", let go of
when the cell fails inside its measured phase, never held without a path."""

import fcntl

import pytest

from kvsweep.cell.process import GatedRun
from kvsweep.cell.request import CellRequest
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.testing.testing_config import Seams


def _can_prepare(path) -> bool:
    """What a spare finds: can it take the gate exclusively right now? (its own open file, as another process)"""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def test_the_measured_phase_holds_the_gate_and_each_phase_is_timed(tmp_path):
    path, timeline = tmp_path / "gate.lock", {}
    gate = GatedRun(str(path), timeline)
    gate("built")
    assert _can_prepare(path)
    gate("measuring")
    assert not _can_prepare(path)
    gate("measured")
    assert _can_prepare(path)
    assert timeline["built_at"] <= timeline["measuring_at"] <= timeline["gate_passed_at"] <= timeline["measured_at"]


WATCHED: dict = {}  # what the stand-in runner below is given, and what it saw


def fail_while_measured(request: CellRequest) -> dict:
    """A stand-in runner: enters its measured phase, checks the gate is held, and dies there."""
    WATCHED["gate"]("measuring")
    WATCHED["held"] = not _can_prepare(WATCHED["path"])
    raise RuntimeError("died while measured")


def test_a_cell_that_fails_while_measured_lets_go_of_the_gate(tmp_path):
    path = tmp_path / "gate.lock"
    gate = GatedRun(str(path), {})
    WATCHED.update(gate=gate, path=path)
    cell = Cell("tiny-llama", "float32", 64, 1, 4, "dynamic", False)
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1)
    request = CellRequest(cell, protocol, seams=Seams(runner=f"{__name__}:fail_while_measured"))
    with pytest.raises(RuntimeError, match="died while measured"):
        gate.run(request)
    assert WATCHED["held"] and _can_prepare(path)


def test_without_a_path_the_gate_is_passed_at_once(tmp_path):
    timeline = {}
    gate = GatedRun("", timeline)
    gate("measuring")
    assert timeline["gate_passed_at"] == timeline["measuring_at"]
    assert list(tmp_path.iterdir()) == []
