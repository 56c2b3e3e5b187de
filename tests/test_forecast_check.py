"""The forecast's gate, as CI runs it: `scripts/forecast_check.py` on the stored cells of real sweeps."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "forecast_check.py"
STORED = ROOT / "scripts" / "benchmarks" / "forecast_check_set.json"


def check(path: Path = STORED) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--set", str(path)], capture_output=True, text=True, timeout=300
    )


def test_the_forecast_is_within_its_bound_on_cells_it_was_never_fitted_on():
    """The forecast as the code is now, on what real check cells took: within the stated bound. A change that
    makes it worse on cells it never saw fails here."""
    proc = check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wall time: median |log(took ÷ forecast)|" in proc.stdout and "MISSED" not in proc.stdout


def test_the_check_set_holds_a_dtype_and_a_model_shape_the_calibration_never_saw():
    """What makes it a check: bfloat16 cells and TinyLlama-1.1B's shape, neither in the calibration set."""
    cells = json.loads(STORED.read_text())["cells"]
    fitted = [c for c in cells if c["set"] == "calibration"]
    checked = [c for c in cells if c["set"] != "calibration"]
    assert fitted and checked
    fitted_dtypes = {c["cell"]["dtype"] for c in fitted}
    fitted_shapes = {json.dumps(c["model"]["shape"], sort_keys=True) for c in fitted}
    assert "bfloat16" not in fitted_dtypes and any(c["cell"]["dtype"] == "bfloat16" for c in checked)
    assert any(json.dumps(c["model"]["shape"], sort_keys=True) not in fitted_shapes for c in checked)
    assert any(c["cell"]["model"] == "tinyllama-1.1b" for c in checked)


def test_the_gate_fails_when_the_cells_took_three_times_their_forecast(tmp_path):
    """The same cells had they taken 3x as long (a forecast gone 3x optimistic): the gate fails, naming what."""
    stored = json.loads(STORED.read_text())
    for cell in stored["cells"]:
        cell["took"] = {k: 3 * v for k, v in cell["took"].items()}
    doctored = tmp_path / "slower.json"
    doctored.write_text(json.dumps(stored))
    proc = check(doctored)
    assert proc.returncode == 1
    assert "MISSED" in proc.stdout and "wall time" in proc.stderr
