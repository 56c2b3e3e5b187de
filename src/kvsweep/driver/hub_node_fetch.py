"""One model on one node: its files fetched into that node's Hub cache (offline: only looked for there).

What each fetch task runs: the repo's file list, only the files a load reads (a repo often holds the same weights
in several formats and files no load opens; the rules follow Transformers' own choice, docs/cluster.md), a check
that they are there, and the model's facts read from them. Whatever goes wrong becomes one line a user can act on,
the reason the model's cells are skipped. A repo is reached only through a source: the Hub, or `+testing.hub=FOLDER`
with no network. The driver's `HF_HUB_OFFLINE`, `HF_HOME` / `HF_HUB_CACHE` and `HF_TOKEN` are read once and sent
to every node's fetch (the token to the fetch tasks only).
"""

import glob
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvsweep.errors import first_line
from kvsweep.models.facts import ModelFacts, read_facts
from kvsweep.models.gguf_source import file_problem, hub_gguf
from kvsweep.models.resolve import ModelRef, cached_snapshot, hub_cache_folder, hub_repo

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


def source_for(folder: str) -> HubSource:
    """The Hub, or with the `+testing.hub=FOLDER` seam, a stand-in serving the repos saved under FOLDER."""
    if not folder:
        return HfHubSource()
    from kvsweep.testing.fake_hub import FolderHub

    return FolderHub(folder)


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


def snapshot_files(snapshot: Path) -> list[str]:
    """The files of a cached snapshot, as paths in the repo (its links resolve into the cache's blobs)."""
    return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())


REASON_CHARS = 300


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
