"""Shared pieces for the benchmarks: the section type, machine facts, ratio formatting."""

import contextlib
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".bench"  # scratch space (virtualenvs, saved models, MLflow stores); git-ignored


@dataclass
class Section:
    """One benchmark's outcome: Markdown for BENCHMARKS.md and the headline figures as numbers."""

    markdown: str
    figures: dict[str, float] = field(default_factory=dict)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, str]:
    """What the figures were measured on; written at the top of BENCHMARKS.md."""
    import torch
    import transformers

    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts = {
        "cpu": f"{cpu}, {len(os.sched_getaffinity(0))} cores",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    for name in ("ray", "mlflow"):
        with contextlib.suppress(ImportError):
            facts[name] = __import__(name).__version__
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        facts["kvsweep commit"] = commit
    except (OSError, subprocess.CalledProcessError):
        pass
    return facts


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def python() -> str:
    return sys.executable
