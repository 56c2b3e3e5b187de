"""Shared pieces for the benchmarks: the section type, machine facts, ratio formatting, the hand-timed loop.

Standard library only at import: bench.py imports this to list and run the benchmarks, and the peer
benchmark's worker imports it inside optimum-benchmark's virtualenv (no kvsweep there); torch and
Transformers are imported inside the functions that need them.
"""

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".bench"  # scratch space (virtualenvs, saved models, MLflow stores); git-ignored
# Added to the environment of the kvsweep runs a benchmark starts: a local Ray without auth or usage stats.
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


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


def plain_generate_kwargs(new_tokens: int) -> dict[str, Any]:
    """Exactly `new_tokens` greedy tokens; no compile (generate would compile a static cache on CUDA by itself)."""
    return dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
        disable_compile=True,
    )  # fmt: skip


def timed_generate(
    model: Any, inputs: Any, cuda: bool, new_tokens: int, label: str = "bare loop", **kwargs: Any
) -> tuple[float, float, Any]:
    """The hand-timed loop's one call, the benchmarks' reference independent of kvsweep's runner.

    Plain `generate` (plain_generate_kwargs plus `kwargs`) with its own hook: a logits processor
    stamping `perf_counter_ns` at each new token (after a CUDA sync on GPU). Returns (ttft_ms, tpot_ms,
    generate's output): TTFT from the call's start to the first stamp, TPOT the mean gap between stamps.
    Torch and Transformers only (either major), so any virtualenv's python can run it.
    """
    import torch
    from transformers import LogitsProcessor

    class Stamps(LogitsProcessor):
        def __init__(self) -> None:
            self.ns: list[int] = []

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            if cuda:
                torch.cuda.synchronize()
            self.ns.append(time.perf_counter_ns())
            return scores

    stamps = Stamps()
    mask = torch.ones_like(inputs)
    options = {**plain_generate_kwargs(new_tokens), **kwargs}
    with torch.inference_mode():
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        out = model.generate(inputs, attention_mask=mask, logits_processor=[stamps], **options)
    if len(stamps.ns) != new_tokens:
        raise RuntimeError(f"{label}: {len(stamps.ns)} tokens, asked for {new_tokens}")
    return (stamps.ns[0] - start) / 1e6, (stamps.ns[-1] - stamps.ns[0]) / 1e6 / (new_tokens - 1), out
