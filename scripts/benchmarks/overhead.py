"""Where a sweep of small cells spends its wall time: cells in their own process, or forked from a template.

Runs the same small tiny-llama sweep on CPU through the real path (`kvsweep.cli.run` in a fresh
driver process: local Ray, journal, MLflow on sqlite) once with `ray.fork_cells=false` and once
forked, interleaved, and splits each sweep's wall time into phases: driver imports, config,
Ray start, planning, MLflow, the template's start where it is not overlapped, then per cell the
critical path (actor process start, imports, model
build, warmup, gate wait, measurement, baseline and summary, result back to the driver), and the
end (report, MLflow close, Ray shutdown). Cell phases come from the actor's timeline
(`environment.timeline` in the journal); driver phases from timers around the driver's calls.

    python scripts/benchmarks/overhead.py [--quick]
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, Section, fmt, markdown_table, median

TITLE = "Overhead: wall time outside measurement for small cells"

# Cell phases on the critical path, in actor-timeline order: (label, start event, end event).
CELL_PHASES = [
    ("actor start (Ray placement, process start, worker boot)", "requested_at", "actor_init_at"),
    ("imports (spare: only the part not overlapped)", "prepare_at", "prepared_at"),
    ("idle spare waiting for its cell", "prepared_at", "run_at"),
    ("imports (forked: the fork hand-off)", "run_at", "imported_at"),
    ("model build", "imported_at", "built_at"),
    ("cold call + warmup", "built_at", "measuring_at"),
    ("gate wait (a spare is importing)", "measuring_at", "gate_passed_at"),
    ("measurement", "gate_passed_at", "measured_at"),
    ("quality baseline + summary", "measured_at", "returned_at"),
]


def grid(quick: bool) -> list[str]:
    """The issue's sweep: 2 caches x 4 contexts x 2 batch sizes of tiny-llama (quick: 2 x 2 x 1)."""
    return [
        "grid.models=[tiny-llama]",
        "grid.dtypes=[float32]",
        "grid.context_lengths=[128,256]" if quick else "grid.context_lengths=[64,128,256,512]",
        "grid.batch_sizes=[1]" if quick else "grid.batch_sizes=[1,2]",
        "grid.max_new_tokens=[32]",
        "grid.caches=[dynamic,static]",
        "measure.warmup=1",
        "measure.repeats=3",
        "measure.min_duration_s=0",
        "device=cpu",
    ]


# -- the driver process (child): a real sweep with timers around the driver's calls
def child(out_dir: Path, overrides: list[str]) -> None:
    from kvsweep.cell.process import process_started_at

    marks: dict[str, float] = {"process_started_at": process_started_at()}
    # What `python -m kvsweep` imports before it composes the config (no torch, no MLflow: see `driver.prewarm`).
    import kvsweep.cli.run  # noqa: F401
    from kvsweep.config import compose  # noqa: F401
    from kvsweep.driver import dry_run, ray_session, sweep  # noqa: F401

    marks["imports_done_at"] = time.time()
    # Timers need the modules they wrap: imported here, outside the measured wall time; Ray's own
    # import (which a real sweep makes inside `connect`) is timed and added to the Ray start.
    import ray  # noqa: F401

    marks["ray_imported_at"] = time.time()
    from kvsweep.driver import actor_placement

    spans: list[tuple[str, str, float, float]] = []  # (what, cell id or "", start, end)

    def timed(owner: object, name: str, label: str, key=lambda *a: "") -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                spans.append((label, key(*args), started, time.time()))

        setattr(owner, name, wrapper)

    timed(ray_session, "connect", "ray_start")
    timed(ray_session, "shutdown", "ray_shutdown")
    timed(sweep, "plan_jobs", "plan")
    timed(sweep, "open_tracking", "mlflow_open")
    timed(sweep, "run_jobs", "cells")
    timed(sweep.Sweep, "record", "recorded", key=lambda self, result, ran=True: result.cell_id)
    timed(actor_placement.Templates, "wait", "template_wait")
    timed(sweep, "run_sweep", "run_sweep")
    from kvsweep.cli import main

    marks["main_at"] = time.time()
    code = main([*overrides, f"mlflow.tracking_uri=sqlite:///{out_dir}/mlflow.db", f"hydra.run.dir={out_dir}/run"])
    marks["main_done_at"] = time.time()
    (out_dir / "driver.json").write_text(json.dumps({"code": code, "marks": marks, "spans": spans}))


# -- the benchmark (parent): run both variants, read journals, split wall time
def sweep_once(label: str, overrides: list[str], work: Path) -> dict:
    out_dir = Path(tempfile.mkdtemp(prefix=f"overhead-{''.join(c if c.isalnum() else '_' for c in label)}-", dir=work))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    started = time.time()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(out_dir), *overrides],
        capture_output=True,
        text=True,
        env=env,
        cwd=out_dir,
        timeout=1800,
    )
    wall = time.time() - started
    if proc.returncode != 0 or not (out_dir / "driver.json").exists():
        raise RuntimeError(f"{label}: sweep failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    driver = json.loads((out_dir / "driver.json").read_text())
    cells = [
        json.loads(line)["result"]
        for line in (out_dir / "run" / "journal.jsonl").read_text().splitlines()
        if '"kind": "cell"' in line
    ]
    return breakdown(driver, cells, wall)


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def breakdown(driver: dict, cells: list[dict], subprocess_wall: float) -> dict:
    marks, spans = driver["marks"], driver["spans"]

    def span(label: str) -> tuple[float, float]:
        return next(((s, e) for what, _, s, e in spans if what == label), (0.0, 0.0))

    def length(label: str) -> float:
        start, end = span(label)
        return end - start

    instrumenting = marks["main_at"] - marks["imports_done_at"]  # not part of a real sweep
    ray_import = marks["ray_imported_at"] - marks["imports_done_at"]
    t0, end = marks["process_started_at"] + instrumenting, marks["main_done_at"]  # t0: shifted past it
    ray_stop = span("ray_shutdown")
    cells_start, cells_end = span("cells")
    finished_at = {cid: s for what, cid, s, _ in spans if what == "recorded"}
    phases: dict[str, float] = {}
    phases["driver imports"] = marks["imports_done_at"] - marks["process_started_at"]
    phases["config (compose, check)"] = span("run_sweep")[0] - marks["main_at"]
    phases["Ray start (import + init)"] = ray_import + length("ray_start")
    phases["plan"] = length("plan")
    phases["MLflow (parent run, on the critical path)"] = length("mlflow_open")
    phases["template start, not overlapped (once per node)"] = length("template_wait")
    phases["other driver stages"] = (
        cells_start - span("run_sweep")[0] - sum(length(x) for x in ("ray_start", "plan", "mlflow_open"))
    )
    ran = [c for c in cells if c["status"] == "ok" and c["environment"].get("timeline")]
    ran.sort(key=lambda c: finished_at.get(c["cell_id"], 0.0))
    window_start = cells_start + length("template_wait")
    cell_totals = {label: 0.0 for label, _, _ in CELL_PHASES}
    cell_totals["result back to the driver + hand-off"] = 0.0
    for c in ran:
        t = c["environment"]["timeline"]
        window_end = finished_at.get(c["cell_id"], cells_end)
        covered = 0.0
        for label, a, b in CELL_PHASES:
            if a in t and b in t:
                part = _overlap(t[a], t[b], window_start, window_end)
                cell_totals[label] += part
                covered += part
        cell_totals["result back to the driver + hand-off"] += (window_end - window_start) - covered
        window_start = window_end
    phases.update(cell_totals)
    phases["report + MLflow close"] = ray_stop[0] - window_start
    phases["Ray shutdown"] = ray_stop[1] - ray_stop[0]
    phases["driver exit"] = end - ray_stop[1]
    wall = end - t0
    measured = cell_totals["measurement"]
    first_measured = min((c["environment"]["timeline"].get("gate_passed_at", end) for c in ran), default=end)
    return {
        "wall_s": wall,
        "cells": len(ran),
        "phases": phases,
        "measured_s": measured,
        "to_first_measured_s": first_measured - t0,
        "outside_per_cell_s": (wall - measured) / max(1, len(ran)),
        "cells_window_outside_per_cell_s": (window_start - cells_start - measured) / max(1, len(ran)),
        "measured_share": measured / wall,
        "subprocess_wall_s": subprocess_wall - instrumenting,
    }


VARIANTS = [
    ("own process (prestart on)", ["ray.fork_cells=false", "ray.prestart=1"]),
    ("forked from template", ["ray.fork_cells=true", "ray.prestart=1"]),
]


def run(quick: bool) -> Section:
    work = ROOT / ".bench" / "overhead"
    work.mkdir(parents=True, exist_ok=True)
    rounds = 1
    results: dict[str, list[dict]] = {label: [] for label, _ in VARIANTS}
    for _ in range(rounds):
        for label, extra in VARIANTS:  # interleaved: the shared machine's load hits both alike
            print(f"  {label} ...", flush=True)
            results[label].append(sweep_once(label, [*grid(quick), *extra], work))
    return section(results, quick)


def section(results: dict[str, list[dict]], quick: bool) -> Section:
    labels = list(results)
    phase_names = list(next(iter(results.values()))[0]["phases"])
    cells = next(iter(results.values()))[0]["cells"]

    def med(label: str, get) -> float:
        return median([get(r) for r in results[label]])

    rows = []
    for name in phase_names:
        values = [med(label, lambda r, n=name: r["phases"][n]) for label in labels]
        if all(abs(v) < 0.005 for v in values):
            continue
        rows.append([name, *(fmt(v, 2) for v in values)])
    rows.append(["**wall**", *(f"**{fmt(med(label, lambda r: r['wall_s']), 1)}**" for label in labels)])
    figures: dict[str, float] = {}
    summary = []
    for label in labels:
        key = label.replace(" ", "_")
        figures[f"{key}.wall_s"] = med(label, lambda r: r["wall_s"])
        figures[f"{key}.outside_per_cell_s"] = med(label, lambda r: r["outside_per_cell_s"])
        figures[f"{key}.cells_window_outside_per_cell_s"] = med(label, lambda r: r["cells_window_outside_per_cell_s"])
        figures[f"{key}.measured_share"] = med(label, lambda r: r["measured_share"])
        figures[f"{key}.to_first_measured_s"] = med(label, lambda r: r["to_first_measured_s"])
        summary.append(
            [
                label,
                fmt(figures[f"{key}.outside_per_cell_s"], 2),
                fmt(figures[f"{key}.cells_window_outside_per_cell_s"], 2),
                f"{100 * figures[f'{key}.measured_share']:.1f} %",
                fmt(figures[f"{key}.to_first_measured_s"], 1),
            ]
        )
    rounds = len(next(iter(results.values())))
    text = [
        f"{cells} tiny-llama cells on CPU (float32, dynamic and static, contexts "
        f"{'128 and 256, batch 1' if quick else '64 to 512, batch 1 and 2'}, 32 new tokens, warmup 1, repeats 3), "
        "one cell at a time, through `kvsweep.cli.run` in a fresh driver process with a local Ray and sqlite MLflow; "
        f"each variant run {rounds}x interleaved, medians shown. Seconds of the sweep's wall time from the "
        "process's start; cell phases are the critical path (what overlaps the previous cell is not counted). "
        "The timers' own imports are left out of the wall time (Ray's import is added to the Ray start, where a "
        "real sweep makes it; MLflow's import overlaps the Ray start in a real sweep and is not counted).",
        "",
        markdown_table(["phase (s)", *labels], rows),
        "",
        markdown_table(
            [
                "variant",
                "s/cell outside measurement (whole sweep)",
                "s/cell outside measurement (cells only)",
                "measured share of wall",
                "command to the first measured phase, s",
            ],
            summary,
        ),
    ]
    return Section("\n".join(text), figures)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), sys.argv[3:])
        return
    section_ = run("--quick" in sys.argv)
    print(section_.markdown)
    print(json.dumps(section_.figures, indent=2))


if __name__ == "__main__":
    main()
