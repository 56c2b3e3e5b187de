"""Which files of a Hub repo a Transformers load reads, so that a node fetches those and no others.

A repo often holds the same weights in several formats and files no load opens (a README, ONNX exports,
another library's checkpoint); fetching them would spend the download on bytes no cell reads. The rules
here follow Transformers' own choice of files, and say why a repo that lacks them cannot be loaded.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
