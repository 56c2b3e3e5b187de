"""conf/ and sweeps/ ship inside the wheel: an installed kvsweep composes sweeps with no repo around."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_finds_conf_and_sweeps(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("kvsweep-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvsweep/conf/kvsweep.yaml" in names and "kvsweep/sweeps/long_context.yaml" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = "import kvsweep, sys; print(kvsweep.__file__); from kvsweep.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "+sweep=long_context", "dry_run=true"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        timeout=300,
        env={"PYTHONPATH": str(site), "PATH": "", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(str(site))  # the wheel's copy, not the checkout
    assert "sweep long_context (dry run)" in proc.stdout and "Qwen/Qwen2.5-7B-Instruct-1M" in proc.stdout
