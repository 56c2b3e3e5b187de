"""kvsweep against optimum-benchmark on the same cells: whole-set wall time and TTFT/TPOT medians.

Same tiny model (kvsweep's tiny-llama preset saved to a folder), same shapes, warmups, repeats and
thread count; optimum-benchmark runs with its process launcher from its own virtualenv (it needs
Transformers 4.x), never as a kvsweep dependency. The two tools run alternately and each figure is
the median over rounds.

    python scripts/benchmarks/peer.py [--quick]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, WORK, Section, device, fmt, markdown_table, median, python, ratio

TITLE = "Against optimum-benchmark: same cells, wall time and medians"

CACHES = ["dynamic", "static", "quantized-quanto-int4"]
# optimum-benchmark's names: backend.cache_implementation (None = its default, dynamic) and cache_config
PEER_CACHES: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "dynamic": (None, None),
    "static": ("static", None),
    "quantized-quanto-int4": ("quantized", {"backend": "quanto", "nbits": 4}),
}
CONTEXT, NEW_TOKENS, BATCH = 256, 32, 1
THREADS = len(os.sched_getaffinity(0))
# A set that installs cleanly (see /work/shared/notes/peer-optimum-benchmark.md); torch first so pip
# takes the local build (CPU here) instead of pulling a CUDA one to satisfy the others.
PEER_TORCH = "torch==2.13.0"
PEER_PINS = [
    "transformers==4.57.6",
    "huggingface-hub==0.36.2",
    "datasets==4.8.5",
    "accelerate==1.15.0",
    "optimum==2.3.0",
    "optimum-quanto==0.2.7",
    "optimum-benchmark==0.6.0",
]
VENV = WORK / "optimum-venv"
MODEL = WORK / "tiny-llama-model"
RUNS = WORK / "peer-runs"
QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OVERRIDE_BENCHMARKS": "1"}

Medians = dict[str, tuple[float, float]]  # cache -> (ttft_ms, tpot_ms)


def say(message: str) -> None:
    print(f"[peer] {message}", file=sys.stderr, flush=True)


def sh(cmd: list[str], log: Path | None = None, cwd: Path = ROOT) -> float:
    """Run a command to completion (output to a log file, if given); return its wall time in seconds."""
    log_handle = log.open("w") if log else None
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **QUIET_ENV}, stdout=log_handle, stderr=log_handle)
    finally:
        if log_handle:
            log_handle.close()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {done.returncode}" + (f"; see {log}" if log else ""))
    return time.perf_counter() - started


def peer_python() -> Path:
    """optimum-benchmark's own virtualenv, created and installed once (a few minutes)."""
    exe = VENV / "bin" / "python"
    probe = [str(exe), "-c", "import optimum_benchmark, optimum.quanto"]
    if exe.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return exe
    say(f"installing optimum-benchmark into {VENV} (once; a few minutes)")
    sh(["python3", "-m", "venv", str(VENV)])
    sh([str(exe), "-m", "pip", "install", "-q", PEER_TORCH])
    sh([str(exe), "-m", "pip", "install", "-q", PEER_TORCH, *PEER_PINS])
    sh([str(exe), "-m", "pip", "check"])
    return exe


def saved_model(peer: Path) -> Path:
    """kvsweep's tiny-llama preset with its seeded random weights, saved once; checked in Transformers 4.x."""
    if not (MODEL / "model.safetensors").exists():
        say(f"saving tiny-llama to {MODEL}")
        code = (
            "import sys; from kvsweep.models.build import build_model; from kvsweep.models.resolve import classify;"
            "build_model(classify('tiny-llama'), 'float32', 'cpu', 0).save_pretrained(sys.argv[1])"
        )
        sh([python(), "-c", code, str(MODEL)])
    check = "import sys; from transformers import AutoModelForCausalLM as M; M.from_pretrained(sys.argv[1])"
    sh([str(peer), "-c", check, str(MODEL)])
    return MODEL


def run_kvsweep(out: Path, caches: list[str], warmup: int, repeats: int) -> tuple[float, Medians]:
    """One `python -m kvsweep` for the whole set (Ray, one fresh actor per cell); medians from its journal."""
    cmd = [
        python(),
        "-m",
        "kvsweep",
        "name=peer",
        f"grid.models=[{MODEL}]",
        "grid.dtypes=[float32]",
        f"grid.context_lengths=[{CONTEXT}]",
        f"grid.batch_sizes=[{BATCH}]",
        f"grid.max_new_tokens=[{NEW_TOKENS}]",
        f"grid.caches=[{','.join(caches)}]",
        f"measure.warmup={warmup}",
        f"measure.repeats={repeats}",
        "measure.min_duration_s=0",  # exactly `repeats` runs, as the peer does
        f"measure.threads={THREADS}",
        f"device={device()}",
        f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db",
        f"hydra.run.dir={out}",
        "rerun=true",
    ]
    out.mkdir(parents=True, exist_ok=True)
    wall = sh(cmd, out / "kvsweep.log")
    medians: Medians = {}
    for line in (out / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") != "cell":
            continue
        result = record["result"]
        if result["status"] != "ok":
            raise RuntimeError(f"kvsweep cell {result['cell']['cache']}: {result['status']} {result['error']}")
        medians[result["cell"]["cache"]] = (result["metrics"]["ttft_ms"], result["metrics"]["tpot_ms"])
    return wall, medians


def peer_config(cache: str, warmup: int, repeats: int) -> dict[str, Any]:
    """One optimum-benchmark cell: process launcher, pytorch backend, inference scenario."""
    implementation, cache_config = PEER_CACHES[cache]
    generate_kwargs: dict[str, Any] = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS}
    if cache_config:
        generate_kwargs["cache_config"] = cache_config
    dev = device()
    return {
        "defaults": ["benchmark", {"backend": "pytorch"}, {"launcher": "process"}, {"scenario": "inference"}, "_self_"],
        "name": f"peer-{cache}",
        "backend": {
            "model": str(MODEL),
            "device": dev,
            **({"device_ids": "0"} if dev == "cuda" else {}),
            "torch_dtype": "float32",
            "cache_implementation": implementation,
            # its two thread settings are swapped: inter_op_num_threads calls torch.set_num_threads
            "inter_op_num_threads": THREADS,
        },
        "scenario": {
            "iterations": repeats,
            "duration": 0,  # else it keeps iterating for 10 s
            "warmup_runs": warmup,
            "input_shapes": {"batch_size": BATCH, "sequence_length": CONTEXT},
            "generate_kwargs": generate_kwargs,
            "latency": True,
            "memory": False,
        },
    }


def peer_medians(report: dict[str, Any], repeats: int) -> tuple[float, float]:
    """TTFT = its prefill latency; TPOT = per-iteration mean token gap, median over iterations.

    Its per-token list is never cleared between iterations: after iteration k it appends every gap
    seen so far, including the gap from one iteration's last token to the next one's first. The
    last repeats*NEW_TOKENS - 1 values are the whole session in order; we split them ourselves.
    """
    prefill = report["prefill"]["latency"]["values"]
    gaps = report["per_token"]["latency"]["values"]
    session = gaps[-(repeats * NEW_TOKENS - 1) :]
    per_run = [session[j * NEW_TOKENS : j * NEW_TOKENS + NEW_TOKENS - 1] for j in range(repeats)]
    tpot = median([sum(run) / len(run) for run in per_run])
    return median(prefill) * 1e3, tpot * 1e3


def run_peer(peer: Path, out: Path, caches: list[str], warmup: int, repeats: int) -> tuple[float, Medians]:
    """One optimum-benchmark command per cell, back to back, timed as a whole."""
    medians: Medians = {}
    wall = 0.0
    for cache in caches:
        cell_dir = out / cache
        cell_dir.mkdir(parents=True, exist_ok=True)
        (out / f"{cache}.yaml").write_text(json.dumps(peer_config(cache, warmup, repeats)))  # JSON is YAML
        cli = [str(peer.parent / "optimum-benchmark"), "--config-dir", str(out), "--config-name", cache]
        wall += sh([*cli, f"hydra.run.dir={cell_dir}", "hydra.job.chdir=true"], out / f"{cache}.log")
        report = json.loads((cell_dir / "benchmark_report.json").read_text())
        medians[cache] = peer_medians(report, repeats)
    return wall, medians


def run(quick: bool) -> Section:
    warmup, repeats, rounds = (1, 3, 1) if quick else (2, 5, 2)
    peer = peer_python()
    saved_model(peer)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    say("throwaway quanto runs (its C++ extension compiles once per environment)")
    run_kvsweep(RUNS / stamp / "throwaway-kvsweep", ["quantized-quanto-int4"], 0, 1)
    run_peer(peer, RUNS / stamp / "throwaway-peer", ["quantized-quanto-int4"], 0, 1)
    walls: dict[str, list[float]] = {"kvsweep": [], "peer": []}
    cells: dict[str, list[Medians]] = {"kvsweep": [], "peer": []}
    for index in range(rounds):
        for tool in ("kvsweep", "peer"):
            out = RUNS / stamp / f"{tool}-{index}"
            if tool == "kvsweep":
                wall, medians = run_kvsweep(out, CACHES, warmup, repeats)
            else:
                wall, medians = run_peer(peer, out, CACHES, warmup, repeats)
            say(f"round {index + 1}/{rounds} {tool}: {wall:.1f} s")
            walls[tool].append(wall)
            cells[tool].append(medians)
    return summarize(walls, cells, warmup, repeats, rounds)


def summarize(
    walls: dict[str, list[float]], cells: dict[str, list[Medians]], warmup: int, repeats: int, rounds: int
) -> Section:
    def cell(tool: str, cache: str, which: int) -> float:
        return median([m[cache][which] for m in cells[tool]])

    ours, theirs = median(walls["kvsweep"]), median(walls["peer"])
    figures = {"wall_ratio": ratio(ours, theirs), "kvsweep_wall_s": ours, "peer_wall_s": theirs}
    rows = []
    for cache in CACHES:
        k_ttft, k_tpot, p_ttft, p_tpot = (cell(t, cache, w) for t in ("kvsweep", "peer") for w in (0, 1))
        figures[f"ttft_ratio_{cache}"] = ratio(k_ttft, p_ttft)
        figures[f"tpot_ratio_{cache}"] = ratio(k_tpot, p_tpot)
        row = [fmt(k_ttft, 2), fmt(k_tpot, 3), fmt(p_ttft, 2), fmt(p_tpot, 3)]
        rows.append([cache, *row, fmt(figures[f"ttft_ratio_{cache}"], 2), fmt(figures[f"tpot_ratio_{cache}"], 2)])
    header = ["cache", "kvsweep TTFT ms", "kvsweep TPOT ms", "peer TTFT ms", "peer TPOT ms", "TTFT ratio", "TPOT ratio"]
    each = {tool: ", ".join(fmt(w, 1) for w in walls[tool]) for tool in walls}
    walls_table = markdown_table(
        ["tool", "whole set, s (median)", "each round, s"],
        [
            ["kvsweep (`python -m kvsweep`, one command)", fmt(ours, 1), each["kvsweep"]],
            [f"optimum-benchmark (process launcher, {len(CACHES)} commands)", fmt(theirs, 1), each["peer"]],
        ],
    )
    markdown = f"""\
The same {len(CACHES)} cells (kvsweep's `tiny-llama` preset saved to a folder, float32, prompt {CONTEXT},
{NEW_TOKENS} new tokens, batch {BATCH}, {warmup} warmup and {repeats} measured runs, {THREADS} torch threads,
device {device()}) measured by kvsweep and by optimum-benchmark 0.6.0 (process launcher, pytorch backend,
Transformers 4.57.6 in its own virtualenv), alternately, {rounds} round(s); each figure is the median over
rounds. Ratios are kvsweep / optimum-benchmark.

**Whole set: kvsweep takes {fmt(figures["wall_ratio"], 2)}x optimum-benchmark's wall time.**

{walls_table}

{markdown_table(header, rows)}

Why they differ. Wall time: kvsweep pays one Ray start and one fresh actor per cell (imports
included) inside a single command; optimum-benchmark is one command per cell, each importing its
stack, spawning a child process that imports it again, and loading the model. Its parent waits
for the child in a busy loop (`while child.is_alive() and not pipe.poll(): pass`), so on a
{THREADS}-core CPU one core is taken from the {THREADS} torch threads measuring: that inflates its TTFT
and TPOT (and their spread) against kvsweep, whose Ray driver sleeps while a cell runs.
Definitions match otherwise: TTFT is the start of `generate` to the
first token's logits (a logits processor stamps it in both tools); TPOT is each run's mean gap
between consecutive tokens, median over runs (optimum-benchmark's own per-token list repeats earlier
runs' gaps and the gap between runs, so the gaps are re-split per run here). Remaining differences:
optimum-benchmark warms up with two full `generate` calls plus {warmup} two-token call(s) (kvsweep: one
cold call plus {warmup} full one(s)), the random input ids differ, and it runs Transformers 4.57, kvsweep 5.x.
Timings on a shared machine are noisy: read the ratios, not the milliseconds.
"""
    return Section(markdown=markdown, figures=figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round, fewer repeats: a smoke run")
    print(run(parser.parse_args().quick).markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
