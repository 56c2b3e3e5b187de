"""The layers are enforced, not described: import-linter's contracts (pyproject.toml) hold for src/.

A cell must not reach the driver, tracking, the report or the CLI; the report never imports MLflow;
planning never imports Ray; nothing below the driver imports it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports not installed: pip install -e '.[test]'"
    proc = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
