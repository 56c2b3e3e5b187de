"""scripts/gpu_smoke.sh's parts that need no GPU: output paths and the summary it prints."""

import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[1]


def absolute(folder: str, cwd: Path) -> str:
    script = ROOT / "scripts/smoke_paths.sh"
    done = subprocess.run([script, folder], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_output_folder_absolute_or_relative_makes_a_working_mlflow_uri(tmp_path):
    assert absolute(str(tmp_path / "abs"), cwd=ROOT) == str(tmp_path / "abs")
    assert absolute("rel/out", cwd=tmp_path) == str(tmp_path / "rel/out")
    for folder in (absolute(str(tmp_path / "abs"), ROOT), absolute("rel/out", tmp_path)):
        Path(folder).mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")  # the script's own form
        client.create_experiment("smoke")
        assert (Path(folder) / "mlflow.db").exists()


def test_summary_names_each_cells_cache_class_and_peaks(finished_sweep):
    """The shared sweep: contexts 64 and 192 x dynamic, static, offloaded, quantized-hqq-int4, 4 new tokens."""
    run = finished_sweep
    done = subprocess.run(
        [sys.executable, ROOT / "scripts/smoke_summary.py", run.run_dir], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("dynamic") and "DynamicCache/DynamicLayer" in line for line in lines), lines
    for context in (64, 192):  # a static cache holds context + new tokens - 1
        reserved = f"StaticCache/StaticLayer max_cache_len={context + 4 - 1}"
        assert any(line.startswith("static") and reserved in line for line in lines), (reserved, lines)
    assert any(line.startswith("offloaded") and "skipped" in line and "CUDA" in line for line in lines)
    assert "forked from a CUDA-clean template: 6 of 6 cells that ran" in lines  # 2 contexts x 3 CPU caches
    assert lines[-1] == "OK: 0 problem(s)"


def test_summary_fails_when_cells_were_not_forked_from_the_template(run_sweep):
    """On a GPU this is how a preload that initialised CUDA shows: the template refuses, cells run unforked."""
    run = run_sweep("grid.caches=[dynamic]", "measure.repeats=2", "ray.fork_cells=false")
    assert run.code == 0
    done = subprocess.run(
        [sys.executable, ROOT / "scripts/smoke_summary.py", run.run_dir], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "forked from a CUDA-clean template: 0 of 1 cells that ran" in done.stdout
    assert "NOT FORKED" in done.stdout and done.stdout.splitlines()[-1] == "FAILED: 1 problem(s)"
