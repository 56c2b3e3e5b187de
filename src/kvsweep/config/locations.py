"""Where conf/ and sweeps/ are: inside the installed package (wheel) or at the repo's top (checkout)."""

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SWEEPS_PATH_ENV = "KVSWEEP_SWEEPS_PATH"


def _first_existing(name: str) -> Path:
    for candidate in (PACKAGE_DIR / name, PACKAGE_DIR.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kvsweep's {name}/ folder is missing (looked in {PACKAGE_DIR} and the repo root)")


def conf_dir() -> Path:
    return _first_existing("conf")


def sweep_dirs() -> list[Path]:
    """Bundled sweeps first, then the user's folders from KVSWEEP_SWEEPS_PATH (later ones win)."""
    extra = [Path(p).expanduser() for p in os.environ.get(SWEEPS_PATH_ENV, "").split(os.pathsep) if p]
    return [_first_existing("sweeps"), *extra]
