"""One sweep, end to end: config -> cells -> plan -> Ray -> MLflow -> table.

Modules are used in the data's direction only; this file wires them and owns the exit code.
"""

import sys
from pathlib import Path
from typing import Any, TextIO

from kvsweep.grid import Protocol, cell_id, expand_grid
from kvsweep.journal import Journal
from kvsweep.models.resolve import KvShape, classify, kv_shape, load_config
from kvsweep.plan import PlannedCell, plan_cell
from kvsweep.progress import SweepProgress
from kvsweep.redact import redact_uri
from kvsweep.results import ERROR, RESULT_STATUSES, SKIPPED, CellResult
from kvsweep.table import MIB, results_csv, results_table


def model_shapes(models: list[str], trust_remote_code: bool) -> tuple[dict[str, KvShape], dict[str, str]]:
    """Read each model's config once (presets instantly). Unreadable ones get an error message."""
    shapes: dict[str, KvShape] = {}
    problems: dict[str, str] = {}
    for model in models:
        ref = classify(model)
        try:
            shapes[model] = kv_shape(load_config(ref, trust_remote_code))
        except Exception as exc:  # a typo'd preset, a missing folder, an unreachable Hub
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            problems[model] = (
                f"model {model!r} could not be resolved: not a bundled preset, not a local folder, "
                f"and the Hub lookup failed ({first[:200]})"
            )
    return shapes, problems


def plan_sweep(cfg: dict[str, Any], device: str) -> tuple[list[PlannedCell], dict[str, str]]:
    cells = expand_grid(cfg["grid"])
    shapes, problems = model_shapes(cfg["grid"]["models"], cfg["trust_remote_code"])
    return [plan_cell(c, device, shapes.get(c.model)) for c in cells], problems


def plan_text(planned: list[PlannedCell], problems: dict[str, str], device: str) -> str:
    lines = [f"{len(planned)} cells on {device}; {sum(p.runs for p in planned)} to run", ""]
    for p in planned:
        kv = "-" if p.kv_stored_bytes is None else f"{p.kv_stored_bytes / MIB:9.2f}"
        dense = "-" if p.kv_dense_bytes is None else f"{p.kv_dense_bytes / MIB:9.2f}"
        what = problems.get(p.cell.model) or ("run" if p.runs else f"skip: {p.skip_reason}")
        lines.append(f"{p.cell.label:70s} kv {kv} MiB (dense {dense}) {what}")
    return "\n".join(lines)


def protocol_of(cfg: dict[str, Any], device: str) -> Protocol:
    m = cfg["measure"]
    return Protocol(warmup=m["warmup"], repeats=m["repeats"], seed=m["seed"], device=device, threads=m["threads"])


def dry_run(cfg: dict[str, Any], out: TextIO | None = None) -> int:
    """Plan only: resolve `auto` from this machine, start nothing."""
    out = out or sys.stdout
    import torch

    device = cfg["device"] if cfg["device"] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    planned, problems = plan_sweep(cfg, device)
    print(f"sweep {cfg['name']} (dry run)\n{plan_text(planned, problems, device)}", file=out)
    return 0


def run_sweep(cfg: dict[str, Any], config_yaml: str, run_dir: Path, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from kvsweep import ray_session
    from kvsweep.scheduler import Job, Limits, run_cells
    from kvsweep.tracking import SweepTracker, default_tracking_uri, runs_url

    tracking_uri = default_tracking_uri(cfg["mlflow"]["tracking_uri"])  # absolute before Ray starts
    session = ray_session.connect(cfg["ray"]["address"])
    try:
        device = ray_session.resolve_device(cfg["device"], session)
        ray_cfg = cfg["ray"]
        ray_session.check_fits(device, session, ray_cfg["gpus_per_cell"], ray_cfg["cpus_per_cell"])
        protocol = protocol_of(cfg, device)
        planned, problems = plan_sweep(cfg, device)
        text = plan_text(planned, problems, device)
        (run_dir / "plan.txt").write_text(text)

        tracker = SweepTracker(tracking_uri, cfg["mlflow"]["experiment"])
        parent = tracker.start_sweep(
            cfg["name"],
            {
                "name": cfg["name"],
                "cells": len(planned),
                "device": device,
                **{f"measure.{k}": v for k, v in cfg["measure"].items()},
            },
            config_yaml,
            text,
        )
        print(
            f"sweep {cfg['name']}: {len(planned)} cells on {device}; MLflow "
            f"{redact_uri(tracking_uri)} parent run {parent}",
            file=out,
            flush=True,
        )
        jobs, results = [], []
        progress = SweepProgress(len(planned), sum(p.runs and p.cell.model not in problems for p in planned), out)
        shape_only = {m: classify(m).kind == "preset" for m in cfg["grid"]["models"]}

        journal = Journal(run_dir)

        def record(result: CellResult, ran: bool = True) -> None:
            results.append(result)
            journal.append(result)  # on disk before MLflow sees it
            tags = {"kvsweep.shape_only": str(shape_only[result.cell["model"]]).lower()}
            tracker.log_cell(result, cfg["name"], device, tags)
            progress.finished(result, ran)

        for p in planned:
            cid = cell_id(p.cell, protocol)
            if p.cell.model in problems:
                record(CellResult(cid, p.cell.to_dict(), ERROR, error=problems[p.cell.model]), ran=False)
            elif not p.runs:
                record(CellResult(cid, p.cell.to_dict(), SKIPPED, error=p.skip_reason or ""), ran=False)
            else:
                jobs.append(Job(cid, p.cell.to_dict()))

        limits = Limits(
            gpus_per_cell=ray_cfg["gpus_per_cell"],
            cpus_per_cell=ray_cfg["cpus_per_cell"],
            max_concurrent=max_concurrent(ray_cfg["max_concurrent"], device, session.gpus, ray_cfg["gpus_per_cell"]),
            cell_timeout_s=ray_cfg["cell_timeout_s"],
            max_retries=ray_cfg["max_retries"],
        )
        run_cells(
            jobs,
            protocol.to_dict(),
            limits,
            record,
            lambda job: progress.started(),
            cfg["testing"]["faults"],
            cfg["trust_remote_code"],
        )

        table = results_table(results)
        csv_text = results_csv(results)
        (run_dir / "results.csv").write_text(csv_text)
        (run_dir / "results.txt").write_text(table)
        tracker.finish_sweep(progress.counts_by_status(), csv_text, table, "FINISHED")
        print(f"\n{table}\n", file=out)
        print(
            f"MLflow: {redact_uri(tracking_uri)}  experiment {cfg['mlflow']['experiment']!r}  parent run {parent}",
            file=out,
        )
        if not tracking_uri.startswith(("http://", "https://")):
            print(f"  mlflow ui --backend-store-uri {tracking_uri}", file=out)
        print(f"  runs: {runs_url(tracking_uri, tracker.experiment_id)}", file=out)
        print(f"  local copy: {run_dir}", file=out)
        return 0 if all(r.status in RESULT_STATUSES for r in results) else 1
    finally:
        ray_session.shutdown(session)


def max_concurrent(configured: int, device: str, gpus: float, gpus_per_cell: int) -> int:
    """Default: one cell per GPU group on CUDA; on CPU one at a time so timings do not interfere."""
    if configured > 0:
        return configured
    return max(1, int(gpus // gpus_per_cell)) if device == "cuda" else 1
