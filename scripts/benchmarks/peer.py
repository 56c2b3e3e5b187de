"""kvsweep against optimum-benchmark on the same cells: whole-set wall time, and TTFT/TPOT against bare loops.

Same tiny model (kvsweep's tiny-llama preset saved to a folder), same shapes, warmups, repeats and
thread count. optimum-benchmark runs from its own virtualenv (it needs Transformers 4.x), never as a
kvsweep dependency. Each round runs five blocks, in an order reversed every other round (ABBA):

- wall time, each tool with its own process isolation: optimum-benchmark's process launcher (one
  command per cell) and kvsweep (one `python -m kvsweep`, each cell in its own forked process);
- TTFT/TPOT: the same kvsweep sweep (its cells at normal priority), optimum-benchmark's inline
  launcher (its process launcher's parent busy-waits on a core), and a bare timed `generate` loop
  run by each virtualenv's python, so each tool is also divided by its own Transformers.

Every tool's cache class is asserted; a cell whose per-run samples spread more than 2x is rerun.

    python scripts/benchmarks/peer.py [--quick]

This file is the orchestrator (it runs the tools, checks what they built and writes the section);
what the two virtualenvs run, the bare loop and optimum-benchmark's inline cell, is peer_worker.py,
which also holds the cell settings (model, shapes, seed, threads, how each cache is asked for).
"""

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import peer_worker
from benchmarks.common import QUIET, ROOT, WORK, Section, device, fmt, markdown_table, median, python, ratio
from benchmarks.peer_worker import BATCH, CONTEXT, MODEL, NEW_TOKENS, REQUESTS, SEED, THREADS

TITLE = "Against optimum-benchmark: same cells, wall time and timing fidelity"

CACHES = ["dynamic", "static", "quantized-quanto-int4"]
# What every tool must have built: the cache class (or a base of it) and every layer's class.
EXPECTED_BUILT = {
    "dynamic": ("DynamicCache", "DynamicLayer"),
    "static": ("StaticCache", "StaticLayer"),
    "quantized-quanto-int4": ("QuantizedCache", "QuantoQuantizedLayer"),
}
MAX_SPREAD = 2.0  # a cell whose per-run TTFT or TPOT max/min exceeds this is rerun
MAX_RERUNS = 2
WALL_TARGET = 0.33  # kvsweep's whole-set wall time against optimum-benchmark's
# A set that installs cleanly (`pip check` passes; optimum-benchmark 0.6.0 does not import with
# transformers 5.x, and needs `optimum` itself installed beside optimum-quanto); torch first so pip
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
RUNS = WORK / "peer-runs"
WORKER = Path(peer_worker.__file__).resolve()  # run by either virtualenv's python
QUIET_ENV = {**QUIET, "OVERRIDE_BENCHMARKS": "1"}
# Ray starts workers at nice 15 unless told otherwise; kvsweep sets this itself for a local Ray
# (driver/ray_session.py; it has no config key), and it is spelled out here so the run cannot differ.
KVSWEEP_ENV = {"RAY_worker_niceness": "0"}
# Block names, in the order of even rounds (odd rounds run them backwards).
PEER_PROCESS, KVSWEEP, BARE_KVSWEEP, BARE_PEER, PEER_INLINE = (
    "optimum-benchmark (process launcher)",
    "kvsweep",
    "bare loop (kvsweep's venv)",
    "bare loop (optimum-benchmark's venv)",
    "optimum-benchmark (inline launcher)",
)
ORDER = [PEER_PROCESS, KVSWEEP, BARE_KVSWEEP, BARE_PEER, PEER_INLINE]
TIMERS = [KVSWEEP, PEER_INLINE, BARE_KVSWEEP, BARE_PEER]  # the blocks whose TTFT/TPOT are compared
# The timing ratios: figure key, numerator, denominator (each tool over its own Transformers, then the tools).
PAIRS = [
    ("kvsweep_over_bare", KVSWEEP, BARE_KVSWEEP),
    ("peer_over_bare", PEER_INLINE, BARE_PEER),
    ("kvsweep_over_peer", KVSWEEP, PEER_INLINE),
]


@dataclass
class CellTimes:
    """One cell as one tool measured it: per-run TTFT and TPOT (ms) and the cache it built."""

    ttft_ms: list[float]
    tpot_ms: list[float]
    built: str  # e.g. `StaticCache/StaticLayer max_cache_len=287`, kvsweep's tag grammar
    built_classes: tuple[str, ...]  # the cache's class and its bases

    @property
    def spread(self) -> float:
        """The larger max/min of the per-run TTFT and TPOT."""
        return max(max(v) / min(v) for v in (self.ttft_ms, self.tpot_ms))

    def value(self, metric: str) -> float:
        return median(self.ttft_ms if metric == "ttft" else self.tpot_ms)


@dataclass
class Block:
    """One tool's pass over the set: its wall time (s) and its cells."""

    wall_s: float
    cells: dict[str, CellTimes]
    transformers: str = ""


def say(message: str) -> None:
    print(f"[peer] {message}", file=sys.stderr, flush=True)


def sh(cmd: list[str], log: Path | None = None, cwd: Path = ROOT, env: dict[str, str] | None = None) -> float:
    """Run a command to completion (output to a log file, if given); return its wall time in seconds."""
    log_handle = log.open("w") if log else None
    started = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, cwd=cwd, env={**os.environ, **QUIET_ENV, **(env or {})}, stdout=log_handle, stderr=log_handle
        )
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


# ---- kvsweep: one sweep for the set; per-run samples from its journal, the cache class from MLflow


def run_kvsweep(out: Path, caches: list[str], warmup: int, repeats: int) -> Block:
    """One `python -m kvsweep` for the set (Ray, each cell in its own process forked from a warm template)."""
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
        "measure.min_duration_s=0",  # exactly `repeats` runs, as the others do
        "measure.max_host_contention=1",  # no re-run of contended calls: the others have none
        f"measure.threads={THREADS}",
        f"measure.seed={SEED}",
        f"device={device()}",
        f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db",
        f"hydra.run.dir={out}",
        "rerun=true",
    ]
    out.mkdir(parents=True, exist_ok=True)
    wall = sh(cmd, out / "kvsweep.log", env=KVSWEEP_ENV)
    built = mlflow_cache_classes(out / "mlflow.db")
    cells: dict[str, CellTimes] = {}
    for line in (out / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") != "cell":
            continue
        result = record["result"]
        cache = result["cell"]["cache"]
        if result["status"] != "ok":
            raise RuntimeError(f"kvsweep cell {cache}: {result['status']} {result['error']}")
        check_environment(cache, result["environment"])
        runs = result["samples"]["repeats"]
        tag = built[cache]
        cells[cache] = CellTimes(
            ttft_ms=[r["ttft_ms"] for r in runs],
            tpot_ms=[sum(r["gaps_ms"]) / len(r["gaps_ms"]) for r in runs],
            built=tag,
            built_classes=(tag.split("/", 1)[0],),  # kvsweep itself checked the object's bases
        )
    return Block(wall, cells)


def mlflow_cache_classes(db: Path) -> dict[str, str]:
    """cache -> the `kvsweep.cache_class` tag of its MLflow run (read with sqlite3: no MLflow import)."""
    query = (
        "SELECT p.value, t.value FROM params p JOIN tags t ON p.run_uuid = t.run_uuid "
        "WHERE p.key = 'cache' AND t.key = 'kvsweep.cache_class'"
    )
    with sqlite3.connect(db) as connection:
        rows = connection.execute(query).fetchall()
    tags: dict[str, str] = {}
    for cache, tag in rows:
        if tags.setdefault(cache, tag) != tag:
            raise RuntimeError(f"kvsweep's MLflow runs for {cache} carry two cache classes: {tags[cache]}, {tag}")
    return tags


def check_environment(cache: str, environment: dict[str, Any]) -> None:
    """kvsweep's cell ran at this process's priority and with the thread count the others use."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    if environment.get("niceness") != ours or environment.get("torch_threads") != THREADS:
        raise RuntimeError(
            f"kvsweep cell {cache} ran at nice {environment.get('niceness')} with {environment.get('torch_threads')} "
            f"threads; the other tools run at nice {ours} with {THREADS}"
        )


# ---- optimum-benchmark: one command per cell; process launcher (wall) or inline launcher (timing)


def peer_config(cache: str, warmup: int, repeats: int, launcher: str) -> dict[str, Any]:
    """One optimum-benchmark cell: pytorch backend, inference scenario, the given launcher."""
    implementation, cache_config = REQUESTS[cache]
    generate_kwargs: dict[str, Any] = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS}
    generate_kwargs["disable_compile"] = True  # on CUDA generate would compile a static cache; kvsweep does not
    if cache_config:
        generate_kwargs["cache_config"] = cache_config
    dev = device()
    return {
        "defaults": ["benchmark", {"backend": "pytorch"}, {"launcher": launcher}, {"scenario": "inference"}, "_self_"],
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


def peer_runs(report: dict[str, Any], repeats: int) -> tuple[list[float], list[float]]:
    """Per-run TTFT (its prefill latency) and TPOT (mean token gap), in ms.

    Its per-token list is never cleared between iterations: after iteration k it appends every gap
    seen so far, including the gap from one iteration's last token to the next one's first. The
    last repeats*NEW_TOKENS - 1 values are the whole session in order; we split them ourselves.
    """
    prefill = report["prefill"]["latency"]["values"]
    gaps = report["per_token"]["latency"]["values"]
    session = gaps[-(repeats * NEW_TOKENS - 1) :]
    per_run = [session[j * NEW_TOKENS : j * NEW_TOKENS + NEW_TOKENS - 1] for j in range(repeats)]
    if len(prefill) != repeats or any(len(run) != NEW_TOKENS - 1 for run in per_run):
        raise RuntimeError(f"optimum-benchmark reported {len(prefill)} runs and {len(gaps)} gaps, expected {repeats}")
    return [p * 1e3 for p in prefill], [sum(run) / len(run) * 1e3 for run in per_run]


def run_peer(peer: Path, out: Path, caches: list[str], warmup: int, repeats: int, launcher: str) -> Block:
    """One optimum-benchmark command per cell, back to back, timed as a whole.

    Process launcher: its own console script, as a user runs it (the cache class is not observed:
    its child is a spawned process). Inline: peer_worker.py's `peer-cell` entry point, which hooks the
    loaded model to record the cache each `generate` built, then runs the same CLI in-process.
    """
    cells: dict[str, CellTimes] = {}
    wall = 0.0
    for cache in caches:
        cell_dir = out / cache
        cell_dir.mkdir(parents=True, exist_ok=True)
        (out / f"{cache}.yaml").write_text(json.dumps(peer_config(cache, warmup, repeats, launcher)))  # JSON is YAML
        args = ["--config-dir", str(out), "--config-name", cache, f"hydra.run.dir={cell_dir}", "hydra.job.chdir=true"]
        built_file = out / f"{cache}.built.json"
        if launcher == "inline":
            cli = [str(peer), str(WORKER), "peer-cell", str(built_file), *args]
        else:
            cli = [str(peer.parent / "optimum-benchmark"), *args]
        wall += sh(cli, out / f"{cache}.log")
        report = json.loads((cell_dir / "benchmark_report.json").read_text())
        ttft, tpot = peer_runs(report, repeats)
        if launcher == "inline":
            seen = {(b["tag"], tuple(b["classes"])) for b in json.loads(built_file.read_text())}
            if len(seen) != 1:
                raise RuntimeError(f"optimum-benchmark {cache}: generate built {len(seen)} kinds of cache: {seen}")
            tag, classes = seen.pop()
        else:
            tag, classes = "not observed", ()
        cells[cache] = CellTimes(ttft, tpot, tag, classes)
    return Block(wall, cells)


def run_bare(exe: Path, out: Path, caches: list[str], warmup: int, repeats: int) -> Block:
    """peer_worker.py's bare `generate` loop, run by the given virtualenv's python (one process for the set)."""
    out.mkdir(parents=True, exist_ok=True)
    result = out / "bare.json"
    cmd = [str(exe), str(WORKER), "bare", str(result), ",".join(caches), str(warmup), str(repeats), device()]
    wall = sh(cmd, out / "bare.log")
    data = json.loads(result.read_text())
    cells = {
        cache: CellTimes(c["ttft_ms"], c["tpot_ms"], c["built"]["tag"], tuple(c["built"]["classes"]))
        for cache, c in data["cells"].items()
    }
    return Block(wall, cells, data["transformers"])


def check_built(tool: str, cache: str, times: CellTimes) -> None:
    """The cache object a tool's `generate` used is the one the cell names."""
    cache_class, layer_class = EXPECTED_BUILT[cache]
    kinds = times.built.split(" ", 1)[0].split("/")
    layers = kinds[1].split("+") if len(kinds) == 2 else []
    nbits_ok = ("nbits=4" in times.built.split()) == cache.endswith("int4")
    if cache_class not in times.built_classes or layers != [layer_class] or not nbits_ok:
        raise RuntimeError(f"{tool} {cache}: expected {cache_class}/{layer_class}, generate built {times.built}")


# ---- the rounds


Measure = Callable[[list[str], Path], Block]


def steady(measure: Measure, out: Path, label: str, reruns: int, notes: list[str]) -> Block:
    """Measure the set; rerun (up to `reruns` times) any cell whose per-run samples spread over MAX_SPREAD.

    The steadiest attempt is kept; each rerun cell adds a note with its spread per attempt.
    """
    block = measure(CACHES, out)
    for cache in CACHES:
        spreads = [block.cells[cache].spread]
        while spreads[-1] > MAX_SPREAD and len(spreads) <= reruns:
            say(f"{label}, {cache}: per-run samples spread {spreads[-1]:.1f}x > {MAX_SPREAD:g}x, rerun {len(spreads)}")
            again = measure([cache], out.parent / f"{out.name}-rerun-{cache}-{len(spreads)}").cells[cache]
            spreads.append(again.spread)
            if again.spread < block.cells[cache].spread:
                block.cells[cache] = again
        if len(spreads) > 1:
            still = f", still over: the steadiest ({block.cells[cache].spread:.1f}x) kept" * (spreads[-1] > MAX_SPREAD)
            notes.append(f"{label}, {cache}: {' → '.join(f'{s:.1f}x' for s in spreads)}{still}")
    return block


def run(quick: bool) -> Section:
    warmup, repeats, rounds, reruns = (1, 3, 1, 1) if quick else (2, 5, 6, MAX_RERUNS)
    peer = peer_python()
    saved_model(peer)
    stamp = RUNS / time.strftime("%Y%m%d-%H%M%S")
    say("prepare: a bare pass in each virtualenv (quanto compiles its C++ extension once per environment)")
    run_bare(Path(python()), stamp / "prepare-bare-kvsweep", ["quantized-quanto-int4"], 0, 1)
    run_bare(peer, stamp / "prepare-bare-peer", ["quantized-quanto-int4"], 0, 1)
    if not quick:
        say("prepare: a throwaway cell of each tool (cold file caches)")
        run_kvsweep(stamp / "prepare-kvsweep", ["dynamic"], 0, 1)
        run_peer(peer, stamp / "prepare-peer", ["dynamic"], 0, 1, "process")
    measures: dict[str, Measure] = {
        PEER_PROCESS: lambda caches, out: run_peer(peer, out, caches, warmup, repeats, "process"),
        KVSWEEP: lambda caches, out: run_kvsweep(out, caches, warmup, repeats),
        BARE_KVSWEEP: lambda caches, out: run_bare(Path(python()), out, caches, warmup, repeats),
        BARE_PEER: lambda caches, out: run_bare(peer, out, caches, warmup, repeats),
        PEER_INLINE: lambda caches, out: run_peer(peer, out, caches, warmup, repeats, "inline"),
    }
    slugs = dict(zip(ORDER, ["peer-process", "kvsweep", "bare-kvsweep", "bare-peer", "peer-inline"], strict=True))
    history: list[dict[str, Block]] = []
    notes: list[str] = []
    for index in range(rounds):
        blocks: dict[str, Block] = {}
        for name in ORDER if index % 2 == 0 else ORDER[::-1]:
            out = stamp / f"round-{index + 1}" / slugs[name]
            label = f"round {index + 1}, {name}"
            if name == PEER_PROCESS:  # wall time only: its timings carry the busy-wait
                blocks[name] = measures[name](CACHES, out)
            else:
                blocks[name] = steady(measures[name], out, label, reruns, notes)
                for cache in CACHES:
                    check_built(name, cache, blocks[name].cells[cache])
            say(f"{label}: {blocks[name].wall_s:.1f} s")
        history.append(blocks)
    return summarize(history, notes, warmup, repeats, reruns)


# ---- the section


def best_round(ours: list[float], theirs: list[float]) -> float:
    """The ratio in the least disturbed round: the one where both sides together were fastest."""
    index = min(range(len(ours)), key=lambda i: ours[i] * theirs[i])
    return ratio(ours[index], theirs[index])


def per_round(history: list[dict[str, Block]], tool: str, cache: str, metric: str) -> list[float]:
    return [blocks[tool].cells[cache].value(metric) for blocks in history]


def check_same_reservation(history: list[dict[str, Block]]) -> dict[str, list[str]]:
    """cache -> what each timing tool built (first round); in every round all tools' sizes and bits agree."""
    for cache in CACHES:
        tags = {blocks[tool].cells[cache].built for blocks in history for tool in TIMERS}
        if len({tag.partition(" ")[2] for tag in tags}) != 1:
            raise RuntimeError(f"{cache}: the tools built caches of different sizes or bits: {sorted(tags)}")
    return {cache: [history[0][tool].cells[cache].built for tool in TIMERS] for cache in CACHES}


def summarize(history: list[dict[str, Block]], notes: list[str], warmup: int, repeats: int, reruns: int) -> Section:
    rounds = len(history)
    v5, v4 = history[0][BARE_KVSWEEP].transformers, history[0][BARE_PEER].transformers
    ours = [blocks[KVSWEEP].wall_s for blocks in history]
    theirs = [blocks[PEER_PROCESS].wall_s for blocks in history]
    wall_ratios = [ratio(a, b) for a, b in zip(ours, theirs, strict=True)]
    figures: dict[str, float] = {
        "wall_ratio": median(wall_ratios),
        "wall_ratio_best": best_round(ours, theirs),
        "kvsweep_wall_s": median(ours),
        "peer_wall_s": median(theirs),
        "rounds": float(rounds),
        "cells_rerun": float(len(notes)),
    }
    wall_rows = [
        [str(i + 1), "optimum-benchmark first" if i % 2 == 0 else "kvsweep first", fmt(a, 1), fmt(b, 1), fmt(r, 2)]
        for i, (a, b, r) in enumerate(zip(ours, theirs, wall_ratios, strict=True))
    ]
    wall_rows.append(["median", "", fmt(median(ours), 1), fmt(median(theirs), 1), fmt(figures["wall_ratio"], 2)])
    wall_table = markdown_table(["round", "order", "kvsweep s", "optimum-benchmark s", "ratio"], wall_rows)

    tables = {}
    for metric in ("ttft", "tpot"):
        rows = []
        for cache in CACHES:
            row = [cache]
            for tool in TIMERS:
                row.append(fmt(median(per_round(history, tool, cache, metric)), 2 if metric == "ttft" else 3))
            for key, a, b in PAIRS:
                mine, other = per_round(history, a, cache, metric), per_round(history, b, cache, metric)
                middle = median([ratio(x, y) for x, y in zip(mine, other, strict=True)])
                best = best_round(mine, other)
                figures[f"{metric}_{key}_{cache}"], figures[f"{metric}_{key}_{cache}_best"] = middle, best
                row.append(f"{fmt(middle, 2)} ({fmt(best, 2)})")
            rows.append(row)
        header = ["cache", "kvsweep ms", "optimum-benchmark ms", f"bare {v5} ms", f"bare {v4} ms"]
        header += [f"kvsweep / bare {v5}", f"optimum-benchmark / bare {v4}", "kvsweep / optimum-benchmark"]
        tables[metric] = markdown_table(header, rows)

    built = check_same_reservation(history)
    header = ["cache", "kvsweep (MLflow `kvsweep.cache_class`)", "optimum-benchmark (hooked, inline)"]
    built_table = markdown_table(
        [*header, f"bare {v5}", f"bare {v4}"], [[cache, *(f"`{t}`" for t in tags)] for cache, tags in built.items()]
    )
    inflation = {
        metric: median([
            ratio(blocks[PEER_PROCESS].cells[c].value(metric), blocks[PEER_INLINE].cells[c].value(metric))
            for blocks in history for c in CACHES
        ])
        for metric in ("ttft", "tpot")
    }  # fmt: skip
    figures.update({f"peer_process_over_inline_{m}": v for m, v in inflation.items()})
    verdict = "met" if figures["wall_ratio"] <= WALL_TARGET else "missed"
    reruns = (
        "Cells whose per-run samples spread more than "
        f"{MAX_SPREAD:g}x (max/min of TTFT or TPOT) were rerun at once (kvsweep's as a one-cell sweep), up to "
        f"{reruns} time(s), and the steadiest attempt kept; spread per attempt: " + "; ".join(notes) + "."
        if notes
        else f"No cell's per-run samples spread more than {MAX_SPREAD:g}x (max/min of TTFT or TPOT); none was rerun."
    )
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    markdown = f"""\
The same {len(CACHES)} cells (kvsweep's `tiny-llama` preset saved to a folder, float32, prompt {CONTEXT},
{NEW_TOKENS} new tokens, batch {BATCH}, greedy, {warmup} warmup and {repeats} measured runs, {THREADS} torch threads,
device {device()}) measured by kvsweep, by optimum-benchmark 0.6.0 (pytorch backend, Transformers {v4} in its
own virtualenv) and by a bare timed `generate` loop in each virtualenv. {rounds} round(s) of five blocks,
{" → ".join(ORDER)}; every other round runs them in the reverse order (ABBA), so drift on a shared
machine falls on both sides of each ratio. Ratios are taken within a round; tables give the median of the
per-round ratios and, in brackets, the ratio in the least disturbed round (the one where the two
sides' product was smallest). All statistics are computed here, the same way for every tool, from
each tool's raw per-run values.

**Whole set: kvsweep takes {fmt(figures["wall_ratio"], 2)}x optimum-benchmark's wall time (median of {rounds} round(s);
least disturbed round {fmt(figures["wall_ratio_best"], 2)}x; target ≤ {WALL_TARGET:g}x: {verdict}).**

Wall time, each tool with its own process isolation, as a user runs it: kvsweep as one
`python -m kvsweep` (Ray; each cell measured in its own process forked from a warm template),
optimum-benchmark with its process launcher, one command per cell (each imports its stack, spawns a
child that imports it again and loads the model).

{wall_table}

TTFT and TPOT, median over rounds (ms), and the ratios. optimum-benchmark runs with its inline
launcher here: its process launcher's parent waits for the child in a busy loop
(`while child.is_alive() and not pipe.poll(): pass`), holding one of the {THREADS} cores the measuring
threads need (in these rounds its process-launcher TTFT came out {fmt(inflation["ttft"], 2)}x and its TPOT
{fmt(inflation["tpot"], 2)}x its inline figures). kvsweep's figures come from the same sweeps as its wall time:
its cells ran at nice {nice}, the priority of every other process here (checked in each cell's record;
Ray's default is nice 15, which kvsweep overrides with `RAY_worker_niceness=0` — there is no config
key), with its re-runs of contended calls off (`measure.max_host_contention=1`) so every tool makes
exactly {repeats} measured calls. Each tool is also divided by the bare loop in its own virtualenv (plain
`generate`, a logits processor stamping `perf_counter_ns` per token, the same model folder, prompt
shape, greedy decoding and threads), because the two tools need different Transformers majors:
kvsweep / optimum-benchmark mixes tool and Transformers version, the other two ratios do not.

TTFT:

{tables["ttft"]}

TPOT:

{tables["tpot"]}

The cache each tool built, asserted in every round (class or a base of it, layer class, bits; the
sizes must agree across tools): kvsweep's `kvsweep.cache_class` tag read from its MLflow store;
optimum-benchmark's from a forward pre-hook on its loaded model, read after each `generate` of its
inline runs (its process launcher's spawned child is not hooked; it runs the same config); the bare
loops' from `generate`'s returned cache.

{built_table}

{reruns}

Definitions: TTFT is the start of `generate` to the first token's logits (a logits processor stamps
it in every tool); TPOT is one run's mean gap between consecutive tokens, median over runs
(optimum-benchmark's own per-token list repeats earlier runs' gaps and the gap between runs, so the
gaps are re-split per run here). Remaining differences: optimum-benchmark warms up with two full
`generate` calls plus {warmup} two-token call(s) (kvsweep and the bare loops: one cold call plus {warmup} full
one(s)); the random input ids differ; the bare loops run every cell in one process, the tools a
process per cell. Timings on a shared machine are noisy: read the ratios, not the milliseconds.
"""
    return Section(markdown=markdown, figures=figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round, fewer repeats: a smoke run")
    print(run(parser.parse_args().quick).markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
