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


def test_metric_names_are_spelled_in_one_module_only():
    """A metric key written as a string (`"kl_divergence"`) anywhere but kvsweep/names.py could drift from the
    contract: code uses `Metric.KL_DIVERGENCE`. Docstrings may name metrics; a config key that shares its
    name with a metric (`repeats`: how many calls the config asks for, and how many were kept) is the key."""
    import ast
    from dataclasses import fields

    from kvsweep.config.schema import MeasureConfig
    from kvsweep.names import TIMED, Metric, ci_high, ci_low

    metrics = {v for k, v in vars(Metric).items() if k.isupper()} | {f(m) for m in TIMED for f in (ci_low, ci_high)}
    assert {"ttft_ms", "kl_divergence", "ttft_ms_ci_low"} <= metrics  # what the scan looks for
    bare = metrics - {f.name for f in fields(MeasureConfig)}
    spelled = []
    for path in (ROOT / "src" / "kvsweep").rglob("*.py"):
        if path.name == "names.py" and path.parent.name == "kvsweep":
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in bare and id(node) not in docstrings:
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not spelled, spelled


def _docstrings(tree) -> set[int]:
    import ast

    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    firsts = [owner.body[0] for owner in ast.walk(tree) if isinstance(owner, kinds) and owner.body]
    return {id(s.value) for s in firsts if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)}


def _is_module_path(text: str) -> bool:
    """`kvsweep.cell.run_cell`: a module kvsweep imports by name, not an MLflow key."""
    import importlib.util

    try:
        return importlib.util.find_spec(text.rstrip(".")) is not None
    except (ImportError, ValueError):
        return False


def test_no_two_modules_share_a_name():
    """A module's name says what it holds, once: two `verdict.py` in different packages read as one idea."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT / "src")))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


MAX_MODULE_LINES = 300


def test_no_module_is_over_300_lines():
    """A module past 300 lines holds more than one idea: split it where the ideas part."""
    long = {
        str(path.relative_to(ROOT / "src")): n
        for path in sorted((ROOT / "src").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
