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


def test_mlflow_names_are_spelled_in_one_module_only():
    """A `kvsweep.*` tag written as a string anywhere but kvsweep/names.py could drift from the contract."""
    import ast

    spelled = []
    for path in (ROOT / "src" / "kvsweep").rglob("*.py"):
        if path.name == "names.py" and path.parent.name == "kvsweep":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                key_like = text.startswith(("kvsweep.", "mlflow.")) and " " not in text
                if key_like and not _is_module_path(text):
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {text!r}")
    assert not spelled, spelled


def _is_module_path(text: str) -> bool:
    """`kvsweep.cell.run`: a module kvsweep imports by name, not an MLflow key."""
    import importlib.util

    try:
        return importlib.util.find_spec(text.rstrip(".")) is not None
    except (ImportError, ValueError):
        return False
