"""Every third-party package the code imports is declared in pyproject.toml, so packaging changes
elsewhere (mlflow-skinny without matplotlib, a dependency dropping rich) cannot break kvsweep."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "src" / "kvsweep"


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """Top-level module names imported anywhere under folder (inside functions too) -> files importing them."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def _normalized(requirement: str) -> str:
    """PEP 503 name of a requirement string: 'hydra_core>=1.3' -> 'hydra-core'."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> dict[str, str]:
    """Declared distribution -> where ('dependencies' or 'extra NAME')."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_normalized(r): "dependencies" for r in project["dependencies"]}
    for extra, requirements in project.get("optional-dependencies", {}).items():
        for requirement in requirements:
            declared.setdefault(_normalized(requirement), f"extra {extra}")
    return declared


def test_every_third_party_import_is_a_declared_dependency():
    imports = imported_modules(SOURCES)
    third_party = {m: files for m, files in imports.items() if m not in sys.stdlib_module_names and m != "kvsweep"}
    assert {"torch", "mlflow", "matplotlib", "rich"} <= set(third_party)  # the scan sees what it must
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions()
    undeclared = []
    for module, files in sorted(third_party.items()):
        dists = {_normalized(d) for d in providers.get(module, [])}
        if not dists & set(declared):
            provider = ", ".join(sorted(dists)) or "no installed distribution"
            undeclared.append(f"{module} (from {provider}; {sorted(files)})")
    assert not undeclared, f"imported by src/ but not declared in pyproject.toml: {undeclared}"


def test_report_and_progress_packages_are_core_dependencies():
    """The report runs at the end of every sweep, and the progress display on every terminal: not extras."""
    declared = declared_distributions()
    assert declared.get("matplotlib") == "dependencies"
    assert declared.get("rich") == "dependencies"
