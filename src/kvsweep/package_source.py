"""Facts an installed package states in its own source, read without importing it.

Importing torch or Triton to ask a version or a library name costs seconds and, on a GPU host, may
touch CUDA; both state what kvsweep needs as a plain top-level assignment in one file.
"""

import ast
import importlib.util
from pathlib import Path


def package_file(package: str, *parts: str) -> Path | None:
    """A file inside an installed package's folder (`parts` below it), or None when it is not installed."""
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    return Path(folders[0], *parts) if folders else None


def assigned_value(path: Path | None, name: str) -> object | None:
    """The literal a module assigns to `name` at its top level (`name = "..."`, a list of strings ...),
    or None when the file is missing or unreadable, or assigns no literal to it."""
    try:
        module = ast.parse(path.read_text()) if path else None
    except (OSError, SyntaxError, ValueError):
        return None
    for statement in module.body if module else []:
        if isinstance(statement, ast.Assign):
            targets = statement.targets
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets = [statement.target]  # `cuda: Optional[str] = "12.8"` (torch/version.py)
        else:
            continue
        if any(getattr(t, "id", None) == name for t in targets):
            try:
                return ast.literal_eval(statement.value)
            except ValueError:
                return None
    return None
