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


def _third_party(*folders: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for folder in folders:
        for module, files in imported_modules(folder).items():
            if module not in sys.stdlib_module_names and module != "kvsweep":
                found.setdefault(module, set()).update(files)
    return found


def _not_provided_by(imports: dict[str, set[str]], declared: set[str]) -> list[str]:
    """Imported modules whose installed distribution is none of `declared`, with the files importing them."""
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, files in sorted(imports.items()):
        # a module nothing installed here provides (a CUDA-only extra on this CPU machine): declared by its name
        dists = {_normalized(d) for d in providers.get(module, [])} or {_normalized(module)}
        if not dists & declared:
            provider = ", ".join(sorted(dists)) or "no installed distribution"
            missing.append(f"{module} (from {provider}; {sorted(files)})")
    return missing


def test_every_third_party_import_is_a_declared_dependency():
    third_party = _third_party(SOURCES)
    assert {"torch", "mlflow", "matplotlib", "rich"} <= set(third_party)  # the scan sees what it must
    undeclared = _not_provided_by(third_party, set(declared_distributions()))
    assert not undeclared, f"imported by src/ but not declared in pyproject.toml: {undeclared}"


def test_what_every_sweep_runs_needs_no_extra():
    """The driver (its progress display on every terminal) and the report (written at the end of every
    sweep) run in every sweep: what they import must come with `pip install kvsweep`, not an extra."""
    always = _third_party(SOURCES / "driver", SOURCES / "report")
    assert {"rich", "matplotlib", "ray"} <= set(always)  # the progress display, the plots, the cluster
    core = {name for name, where in declared_distributions().items() if where == "dependencies"}
    in_extras = _not_provided_by(always, core)
    assert not in_extras, f"imported by every sweep but not a core dependency in pyproject.toml: {in_extras}"
