"""One model on one node: its files fetched into that node's Hub cache (offline: only looked for there).

This is what each fetch task runs. It reads the repo's file list, fetches only what a load reads, checks the
files are there, and reads the model's facts from them; whatever goes wrong becomes one line a user can
act on, the reason the model's cells are skipped.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

from kvsweep.driver.hub_environment import HubSettings
from kvsweep.driver.hub_sources import HubSource
from kvsweep.driver.load_files import files_to_fetch, load_problem, snapshot_files, weights_index
from kvsweep.errors import first_line
from kvsweep.models.facts import ModelFacts, read_facts
from kvsweep.models.gguf_source import file_problem, hub_gguf
from kvsweep.models.resolve import ModelRef, cached_snapshot, hub_cache_folder, hub_repo

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
