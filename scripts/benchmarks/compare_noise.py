"""How far identical sweeps drift apart, and what `python -m kvsweep compare` says about them.

The quickstart sweep is run N times in a row through `python -m kvsweep` (the first fresh, the
others `rerun=true`), nothing changed between runs. Every pair is compared with every threshold at 0:
for each metric, the largest change between two runs among cells whose 95% intervals do not overlap
(the changes an interval alone would call) is what the default thresholds must stay above. Then every
pair again at the defaults (how many regressions identical sweeps produce: the target is none), and
the last two runs through the real command line, as a user would see them.

    python scripts/benchmarks/compare_noise.py [--quick]
"""

import itertools
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QUIET, WORK, Section, fmt, markdown_table

TITLE = "Compare: identical quickstart sweeps, side by side"
CALLED = ("slower", "faster", "larger", "smaller", "worse", "better")


def _sweeps(scratch: Path, n: int) -> list[float]:
    walls = []
    for i in range(n):
        run_dir = scratch / f"run{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        again = ["rerun=true"] if i else []
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvsweep",
                *again,
                f"hydra.run.dir={run_dir}",
                f"mlflow.tracking_uri={_uri(scratch)}",
            ],
            cwd=scratch,
            env={**os.environ, **QUIET},
            check=True,
            capture_output=True,
        )
        walls.append(time.perf_counter() - started)
    return walls


def _uri(scratch: Path) -> str:
    return f"sqlite:///{scratch / 'mlflow.db'}"


def _sides(scratch: Path) -> list:
    from kvsweep.compare.comparison import SweepSide
    from kvsweep.tracking.store import cell_results, open_client, sweep_parents

    client = open_client(_uri(scratch))
    experiment = client.get_experiment_by_name("kvsweep").experiment_id
    runs = sweep_parents(client, experiment)[::-1]  # oldest first
    return [
        SweepSide(r.info.run_id, f"run {i + 1}", cell_results(client, experiment, r.info.run_id))
        for i, r in enumerate(runs)
    ]


def run(quick: bool = False) -> Section:
    from kvsweep.compare.comparison import compare_sweeps
    from kvsweep.compare.judging import BY_NAME, DEFAULT_MEMORY_THRESHOLD, DEFAULT_THRESHOLD, Thresholds, change

    n = 2 if quick else 5
    scratch = WORK / "compare_noise"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    walls = _sweeps(scratch, n)
    sides = _sides(scratch)
    pairs = list(itertools.combinations(sides, 2))

    apart: dict[str, list[float]] = {}
    overlapping: dict[str, list[float]] = {}
    for a, b in pairs:
        for row in compare_sweeps(a, b, Thresholds(0.0, 0.0)).rows:
            if row.ratio is None or row.metric not in BY_NAME or BY_NAME[row.metric].kind == "exact":
                continue
            (apart if row.verdict in CALLED else overlapping).setdefault(row.metric, []).append(change(row.ratio))
    metrics = [m for m in BY_NAME if m in apart or m in overlapping]
    drift_rows = []
    for m in metrics:
        called = sorted(apart.get(m, []))
        allowance = DEFAULT_THRESHOLD if BY_NAME[m].kind == "timing" else DEFAULT_MEMORY_THRESHOLD
        worst = called[-1] if called else 0.0
        drift_rows.append(
            [
                f"`{m}`",
                f"{len(called)} of {len(called) + len(overlapping.get(m, []))}",
                f"{100 * (called[len(called) // 2] if called else 0):.1f}",
                f"{100 * worst:.1f}",
                f"{allowance:.2f}",
                "held" if worst <= allowance else "**missed**",
            ]
        )

    defaults = Thresholds()
    tallies = [Counter(r.verdict for r in compare_sweeps(a, b, defaults).rows) for a, b in pairs]
    pair_rows = [
        [
            f"{a.name} vs {b.name}",
            *(str(t[v]) for v in ("within noise", "same", "contended")),
            str(sum(t[v] for v in CALLED)),
        ]
        for (a, b), t in zip(pairs, tallies, strict=True)
    ]
    regressions = sum(t["slower"] + t["larger"] + t["worse"] for t in tallies)

    cli = subprocess.run(
        [sys.executable, "-m", "kvsweep", "compare", "latest~1", "latest", "--tracking-uri", _uri(scratch)],
        cwd=scratch,
        capture_output=True,
        text=True,
    )
    lines = cli.stdout.strip().splitlines()
    counts = next((line for line in lines if " metric comparisons: " in line), "(no counts line)")

    worst_timing = max((max(apart.get(m, [0.0])) for m in metrics if BY_NAME[m].kind == "timing"), default=0.0)
    worst_other = max((max(apart.get(m, [0.0])) for m in metrics if BY_NAME[m].kind != "timing"), default=0.0)
    figures = {
        "sweeps": float(n),
        "worst_timing_drift": worst_timing,
        "worst_memory_quality_drift": worst_other,
        "regressions_at_defaults": float(regressions),
        "cli_exit_code": float(cli.returncode),
    }
    text = [
        f"The quickstart sweep run {n} times in a row through `python -m kvsweep` on this machine (nothing changed "
        f"between runs; {fmt(sum(walls) / n, 0)} s per run), every pair of runs compared ({len(pairs)} pairs). "
        "*Apart* = the two cells' 95% intervals do not overlap (memory and quality readings carry none: any "
        "change is apart); *drift* = max(B/A, A/B) − 1 among those, the change an interval alone would call.",
        "",
        markdown_table(
            ["metric", "apart / compared", "median drift %", "worst drift %", "default threshold", "identical sweeps"],
            drift_rows,
        ),
        "",
        f"Every pair at the default thresholds (timings {DEFAULT_THRESHOLD}, memory and quality "
        f"{DEFAULT_MEMORY_THRESHOLD}):",
        "",
        markdown_table(["pair", "within noise", "same", "contended", "called"], pair_rows),
        "",
        f"**Regressions called between identical sweeps at the defaults: {regressions}** (target: 0). "
        f"Worst timing drift {100 * worst_timing:.1f}% against the {DEFAULT_THRESHOLD} default; worst "
        f"memory/quality drift {100 * worst_other:.1f}% against {DEFAULT_MEMORY_THRESHOLD}.",
        "",
        f"What a user sees, `python -m kvsweep compare latest~1 latest` on the last two runs (exit {cli.returncode}):",
        "",
        "```text",
        *[line for line in lines if line.startswith(("environment", "protocol", "thresholds"))],
        counts,
        "```",
    ]
    return Section("\n".join(text), figures)


def main() -> None:
    print(run("--quick" in sys.argv).markdown)


if __name__ == "__main__":
    main()
