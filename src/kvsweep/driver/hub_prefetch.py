"""Fetch the Hugging Face Hub models the pending cells need, once per node, before any cell starts.

A Hub model fetched inside its first cell would spend that cell's timeout on the download (a 16 GB
checkpoint can take all of it), and cells starting together on a node would race for the same files.
Here each node that runs cells fetches every Hub model in a short Ray task, as `native_builds` builds
extensions: only the files a model load reads (config, tokenizer, the weights Transformers picks and
their index; for a GGUF model, `org/name/file.gguf`, that one file), into that node's Hub cache. The
cells are then told to load from the cached snapshot, with no request to the Hub. A model that cannot
be fetched (gated without access, missing, offline and not cached) turns its cells into `skipped` with
the reason before any GPU time is spent.

The driver's environment decides: `HF_HUB_OFFLINE` (fetch nothing; what is cached is used),
`HF_HOME` / `HF_HUB_CACHE` (the cache every node fetches into and the cells read; unset: each node's
own) and `HF_TOKEN` (sent to the fetch tasks only; unset: each node's own token, if any).
"""

import glob
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import ray

from kvsweep.errors import first_line
from kvsweep.grid import Cell
from kvsweep.model_names import is_path
from kvsweep.models.facts import ModelFacts, read_facts
from kvsweep.models.gguf_source import file_problem, hub_gguf
from kvsweep.models.resolve import ModelRef, cached_snapshot, classify, hub_cache_folder, hub_repo
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.units import GB

FETCH_TIMEOUT_S = 4 * 3600.0  # a 16 GB checkpoint over a slow link; each cell keeps its own timeout
PROGRESS_EVERY_S = 30.0
REASON_CHARS = 300
MB = 10**6

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tekken.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.jinja",
    "chat_template.json",
)
# Transformers' own order: one safetensors file, else its index and shards, else the same for pytorch .bin.
WEIGHT_FORMATS = (
    ("model.safetensors", "model.safetensors.index.json"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
)
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubSettings:
    """What the driver's environment says about the Hub, for every node's fetch."""

    offline: bool  # HF_HUB_OFFLINE: fetch nothing, use what the cache holds
    token: str | None  # HF_TOKEN: None, each node's own token (its HF_TOKEN or HF_HOME/token)
    cache_dir: str | None  # HF_HUB_CACHE, else HF_HOME/hub; None: each node's own cache


def hub_settings(environ: Mapping[str, str] | None = None) -> HubSettings:
    """The settings from the driver's environment (os.environ unless given), read when the sweep runs."""
    env = os.environ if environ is None else environ
    offline = any(env.get(key, "").strip().lower() in _TRUE for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    cache_dir = env.get("HF_HUB_CACHE") or (os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None)
    expanded = os.path.expanduser(os.path.expandvars(cache_dir)) if cache_dir else None
    return HubSettings(offline, env.get("HF_TOKEN") or None, expanded)


def hub_models(models: Iterable[str]) -> list[str]:
    """The references that are Hub ids (not a bundled preset, not a folder on this machine), in order."""
    return list(dict.fromkeys(m for m in models if classify(m).kind == "hub"))


def models_to_fetch(pending: list[PlannedCell], problems: Mapping[str, str]) -> list[str]:
    """The Hub models of the cells still to run. One the planner could not read is fetched only when it is
    named as a Hub repo (`org/name`, or a GGUF file in one: `org/name/file.gguf`): a bare name that is no preset
    and no folder stays the planner's error, as it is most likely a mistyped preset."""
    return hub_models(
        p.cell.model
        for p in pending
        if (p.runs and p.cell.model not in problems)
        or (p.cell.model in problems and (is_repo_id(p.cell.model) or hub_gguf(p.cell.model) is not None))
    )


def is_repo_id(reference: str) -> bool:
    """`org/name`, as every Hub repo is named today (a bare `gpt2` is an old alias the Hub still answers)."""
    return reference.count("/") == 1 and not is_path(reference) and all(reference.split("/"))


def files_to_fetch(files: Iterable[str], index: dict[str, Any] | None = None, with_code: bool = False) -> list[str]:
    """The files of a repo a model load reads: its config, its tokenizer's files, and the weights
    Transformers would pick (`model.safetensors`, else the safetensors index and the shards it names, else
    the same for `pytorch_model.bin`), never other formats or duplicates. Files in sub-folders are
    never read by a load. `index`: the weights index once read (its shards are added); `with_code`: the
    repo's own `.py` files (trust_remote_code)."""
    top = {f for f in files if "/" not in f}
    wanted = [f for f in (*CONFIG_FILES, *TOKENIZER_FILES) if f in top]
    wanted += sorted(f for f in top if f.endswith(".tiktoken"))  # a tiktoken tokenizer's ranks
    if with_code:
        wanted += sorted(f for f in top if f.endswith(".py"))
    for single, index_file in WEIGHT_FORMATS:
        if single in top:
            return [*wanted, single]
        if index_file in top:
            shards = sorted(set((index or {}).get("weight_map", {}).values()))
            return [*wanted, index_file, *shards]
    return wanted


def weights_index(files: Iterable[str]) -> str | None:
    """The weights index among `files` a load would read (its shards are known once it is read), or None."""
    picked = files_to_fetch(files)
    return next((f for f in picked if f.endswith(".index.json")), None)


def load_problem(files: Iterable[str]) -> str | None:
    """Why a load could not read a repo with these files: no config, or no weights in a format it reads."""
    top = {f for f in files if "/" not in f}
    if "config.json" not in top:
        return "it has no config.json (not a Transformers model)"
    if not any(single in top or index in top for single, index in WEIGHT_FORMATS):
        return "it has no model.safetensors or pytorch_model.bin weights (nor their index)"
    return None


class HubSource(Protocol):
    """Where a node fetches repos from: the Hub (`HfHubSource`), or a test's stand-in (`testing/fake_hub.py`)."""

    def files(self, repo: str, token: str | None) -> list[str]:
        """Every file's path in the repo's main revision."""
        ...

    def fetch(self, repo: str, files: list[str], token: str | None, cache_dir: str | None) -> Path:
        """`files` of the main revision in the Hub cache under `cache_dir` (None: the default); the snapshot folder."""
        ...


class HfHubSource:
    """The Hugging Face Hub, through huggingface_hub (parallel downloads, resumed, into its cache layout)."""

    def files(self, repo: str, token: str | None) -> list[str]:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo, token=token)
        return [sibling.rfilename for sibling in info.siblings or []]

    def fetch(self, repo: str, files: list[str], token: str | None, cache_dir: str | None) -> Path:
        from huggingface_hub import snapshot_download

        patterns = [glob.escape(f) for f in files]  # exact names: `[` in a name is not a pattern
        return Path(snapshot_download(repo, allow_patterns=patterns, token=token, cache_dir=cache_dir))


class NotFetchable(Exception):
    """A model a node cannot provide, with the reason its cells are skipped."""


@dataclass(frozen=True)
class NodeFetch:
    """One model on one node: why it is not usable there (None: it is), and what it took."""

    problem: str | None
    seconds: float = 0.0
    bytes: int = 0
    files: int = 0
    fetched: bool = False  # False: found in the cache, nothing fetched (offline)
    facts: ModelFacts | None = None  # the model's shape and size, read from the fetched files


def fetch_on_node(repo: str, settings: HubSettings, source: HubSource, with_code: bool = False) -> NodeFetch:
    """What runs on each node: the model's files into this node's cache (offline: only checked there). `repo`:
    the model as the grid names it, a repo id or a GGUF file in one (`org/name/file.gguf`)."""
    started = time.monotonic()
    gguf = hub_gguf(repo)
    try:
        if gguf is not None:
            snapshot, fetched = _gguf_file(repo, gguf, settings, source), not settings.offline
        elif settings.offline:
            snapshot, fetched = _cached(repo, settings.cache_dir), False
        else:
            snapshot, fetched = _fetch(repo, settings, source, with_code), True
    except Exception as exc:  # a refusal, a missing repo, a network error: the reason its cells are skipped
        return NodeFetch(fetch_failure(repo, exc, settings))
    files = [gguf[1]] if gguf is not None else snapshot_files(snapshot)
    read = snapshot / gguf[1] if gguf is not None else snapshot
    if gguf is not None and (problem := file_problem(read)):  # this node's Transformers cannot load it
        return NodeFetch(f"{repo}: {problem}"[:REASON_CHARS])
    try:
        facts: ModelFacts | None = read_facts(ModelRef(str(read), "local"))
    except Exception:  # the cell reads the shape itself after loading
        facts = None
    size = sum((snapshot / f).stat().st_size for f in files)
    return NodeFetch(None, time.monotonic() - started, size, len(files), fetched, facts)


def _gguf_file(model: str, gguf: tuple[str, str], settings: HubSettings, source: HubSource) -> Path:
    """A GGUF model's one file (a repo of GGUF files holds each quantization in its own) in this node's cache:
    the snapshot that holds it; offline, only found there."""
    repo, file = gguf
    if settings.offline:
        return _offline_snapshot(repo, settings.cache_dir, file)
    listed = source.files(repo, settings.token)
    if file not in listed:
        others = [f for f in listed if f.lower().endswith(".gguf")]
        offered = f"; its GGUF files: {', '.join(others[:4])}{' ...' if len(others) > 4 else ''}" if others else ""
        raise NotFetchable(f"{repo} has no file {file}{offered}")
    snapshot = source.fetch(repo, [file], settings.token, settings.cache_dir)
    if not (snapshot / file).is_file():
        raise NotFetchable(f"{model}: fetched, but the cache lacks {file}")
    return snapshot


def _fetch(repo: str, settings: HubSettings, source: HubSource, with_code: bool) -> Path:
    listed = source.files(repo, settings.token)
    if problem := load_problem(listed):
        raise NotFetchable(f"{repo}: {problem}")
    wanted = files_to_fetch(listed, with_code=with_code)
    snapshot = source.fetch(repo, wanted, settings.token, settings.cache_dir)
    if index := weights_index(listed):  # the shards it names, now that it is here
        shards = files_to_fetch(listed, json.loads((snapshot / index).read_text()), with_code)
        if extra := [f for f in shards if f not in wanted]:
            snapshot = source.fetch(repo, extra, settings.token, settings.cache_dir)
        wanted = shards
    missing = [f for f in wanted if not (snapshot / f).is_file()]
    if missing:
        raise NotFetchable(f"{repo}: fetched, but the cache lacks {', '.join(missing[:3])}")
    return snapshot


def _offline_snapshot(repo: str, cache_dir: str | None, file: str = "") -> Path:
    """HF_HUB_OFFLINE: the cached snapshot of `repo` (holding `file`, when one is named), or why there is none."""
    snapshot = cached_snapshot(repo, cache_dir)
    if snapshot is None or (file and not (snapshot / file).is_file()):
        name = f"{repo}/{file}" if file else repo
        where = hub_cache_folder(repo, cache_dir).parent
        raise NotFetchable(f"HF_HUB_OFFLINE is set and {name} is not in the Hub cache ({where})")
    return snapshot


def _cached(repo: str, cache_dir: str | None) -> Path:
    """The cached snapshot with every file a load reads, or why not (HF_HUB_OFFLINE: nothing is fetched)."""
    snapshot = _offline_snapshot(repo, cache_dir)
    files = snapshot_files(snapshot)
    problem = load_problem(files)
    index = weights_index(files)
    if problem is None and index is not None:
        wanted = files_to_fetch(files, json.loads((snapshot / index).read_text()))
        missing = [f for f in wanted if not (snapshot / f).is_file()]
        problem = f"its cached snapshot lacks {', '.join(missing[:3])}" if missing else None
    if problem:
        where = hub_cache_folder(repo, cache_dir).parent
        raise NotFetchable(f"HF_HUB_OFFLINE is set and {repo} is not usable from the Hub cache ({where}): {problem}")
    return snapshot


def snapshot_files(snapshot: Path) -> list[str]:
    """The files of a cached snapshot, as paths in the repo (its links resolve into the cache's blobs)."""
    return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())


def fetch_failure(repo: str, exc: BaseException, settings: HubSettings) -> str:
    """Why a repo could not be fetched, in one line a user can act on."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError

    has_token = bool(settings.token or get_token())
    repo = hub_repo(repo)  # a GGUF file's: the repo it is in
    if isinstance(exc, NotFetchable):
        return str(exc)[:REASON_CHARS]
    if isinstance(exc, GatedRepoError):
        whose = "the token (HF_TOKEN) has no access to it" if has_token else "no token is set (HF_TOKEN)"
        return f"{repo} is gated and {whose}: accept its terms at https://huggingface.co/{repo}, then set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        unseen = "the token cannot see it" if has_token else "no token is set (HF_TOKEN)"
        return f"{repo} is not on the Hub (or it is private and {unseen})"
    if isinstance(exc, OfflineModeIsEnabled):
        return f"{repo} is not in the Hub cache and HF_HUB_OFFLINE is set on the node"
    return f"fetching {repo} failed: {type(exc).__name__}: {first_line(exc, REASON_CHARS)}"[:REASON_CHARS]


@dataclass(frozen=True)
class ModelFetch:
    """A model over every node: why its cells cannot run (None: they can), and what fetching took."""

    problem: str | None
    seconds: float = 0.0  # the slowest node's
    bytes: int = 0
    files: int = 0
    fetched: bool = False
    facts: ModelFacts | None = None

    def line(self, repo: str, nodes: int) -> str:
        """The model's outcome, as the driver prints it."""
        if self.problem is not None:
            return f"{repo}: not available, its cells are skipped: {self.problem}"
        size = f"{self.bytes / GB:.1f} GB" if self.bytes >= GB else f"{self.bytes / MB:.1f} MB"
        what = f"{size} in {self.files} files"
        if not self.fetched:
            return f"{repo}: {what} found in the Hub cache on {nodes} node(s) (HF_HUB_OFFLINE: nothing fetched)"
        return f"{repo}: {what} ready on {nodes} node(s) in {self.seconds:.0f} s (outside every cell's numbers)"


def combine(outcomes: list[tuple[str, NodeFetch]]) -> ModelFetch:
    """One model's outcome over its nodes: a cell may land on any of them, so one node's problem is the
    model's (named with its node where there are several)."""
    failed = [(node, fetch.problem) for node, fetch in outcomes if fetch.problem is not None]
    if failed:
        node, problem = failed[0]
        return ModelFetch(f"{problem} (on node {node})" if len(outcomes) > 1 else problem)
    first = outcomes[0][1]
    seconds = max(fetch.seconds for _, fetch in outcomes)
    return ModelFetch(None, seconds, first.bytes, first.files, any(f.fetched for _, f in outcomes), first.facts)


def prefetch(
    models: list[str],
    settings: HubSettings,
    say: Callable[[str], None],
    source: HubSource | None = None,
    with_code: bool = False,
    device: str = "cpu",
    timeout_s: float = FETCH_TIMEOUT_S,
) -> dict[str, ModelFetch]:
    """Each model on every node that runs cells, in one task per (model, node); progress every
    `PROGRESS_EVERY_S`, each model's outcome as its last node answers."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    resource = "GPU" if device == "cuda" else "CPU"
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource, 0) >= 1]
    if not models or not nodes:
        return {}
    source = source or HfHubSource()
    verb = "checking the Hub cache for" if settings.offline else "fetching"
    say(f"{verb} {len(models)} Hub model(s) on {len(nodes)} node(s) before any cell: {', '.join(models)}")
    task = ray.remote(num_cpus=0, max_retries=0)(fetch_on_node)
    pending: dict[Any, tuple[str, str]] = {}
    for node in nodes:
        placed = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        for model in models:
            pending[placed.remote(model, settings, source, with_code)] = (model, node["NodeManagerAddress"])
    answers: dict[str, list[tuple[str, NodeFetch]]] = {model: [] for model in models}
    results: dict[str, ModelFetch] = {}
    started = time.monotonic()
    while pending:
        left = timeout_s - (time.monotonic() - started)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, min(PROGRESS_EVERY_S, left)))
        if not ready and left <= 0:
            break
        if not ready:
            waiting = sorted({model for model, _ in pending.values()})
            say(f"still fetching after {time.monotonic() - started:.0f} s: {', '.join(waiting)}")
            continue
        model, node = pending.pop(ready[0])
        try:
            answer: NodeFetch = ray.get(ready[0])
        except Exception as exc:  # the task itself died (its node went away)
            answer = NodeFetch(f"fetching {model} failed: {first_line(exc, REASON_CHARS)}")
        answers[model].append((node, answer))
        if len(answers[model]) == len(nodes):
            results[model] = combine(answers[model])
            say(results[model].line(model, len(nodes)))
    for ref, (model, _) in pending.items():  # past the time allowed: those models' cells are skipped
        ray.cancel(ref, force=True)
        if model not in results:
            results[model] = ModelFetch(f"fetching {model} took longer than {timeout_s:.0f} s")
            say(results[model].line(model, len(nodes)))
    return results


def skip_unavailable(planned: list[PlannedCell], fetches: Mapping[str, ModelFetch]) -> list[PlannedCell]:
    """The plan with every cell of a model that could not be fetched skipped with the reason (a cell
    already skipped for another reason keeps its own)."""
    return [
        replace(p, skip_reason=fetch.problem)
        if p.runs and (fetch := fetches.get(p.cell.model)) is not None and fetch.problem is not None
        else p
        for p in planned
    ]


def plan_after(
    pending: list[PlannedCell],
    problems: Mapping[str, str],
    fetches: Mapping[str, ModelFetch],
    replan: Callable[[Cell, ModelFacts], PlannedCell] | None = None,
) -> tuple[list[PlannedCell], dict[str, str]]:
    """The pending cells and the models' problems once the fetches are known: a model that could not be
    fetched has its cells skipped with the reason (no longer an error of the plan); one the planner could not
    read on the driver but the nodes fetched is planned again from its fetched files (`replan`; None where
    the plan cannot be made again, a capacity search's, and it stays an error)."""
    readable = {
        m: fetch.facts for m, fetch in fetches.items() if replan and m in problems and not fetch.problem and fetch.facts
    }
    cells = [
        replan(p.cell, facts) if replan and (facts := readable.get(p.cell.model)) else p
        for p in skip_unavailable(pending, fetches)
    ]
    kept = {m: why for m, why in problems.items() if m not in readable and not (m in fetches and fetches[m].problem)}
    return cells, kept


def source_for(folder: str) -> HubSource:
    """The Hub, or with the `+testing.hub=FOLDER` seam, a stand-in serving the repos saved under FOLDER."""
    if not folder:
        return HfHubSource()
    from kvsweep.testing.fake_hub import FolderHub

    return FolderHub(folder)
