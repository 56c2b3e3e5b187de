"""Names a person can read for model references: tables, selection lines, plot titles, file names.

A local path shows as its folder's name (a Hub cache snapshot as its Hub id), a GGUF file as its name without
`.gguf` (which carries its quantization), a Hub id or preset as given; the full reference stays in the cell's
`model` param. Decided from the text alone, so a report rebuilt elsewhere names models the same way.
"""

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import PurePosixPath

_HF_SNAPSHOT = re.compile(r"models--([^/]+)/snapshots/[^/]+/?$")  # the Hub cache: models--org--name/...
_UNSAFE_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9._-]+")
GGUF_SUFFIX = ".gguf"  # llama.cpp's single-file checkpoints (`models/gguf_source.py`)


def is_path(reference: str) -> bool:
    """Absolute, home- or dot-relative: a folder on disk. `org/name` is a Hub id."""
    return reference.startswith(("/", "~", "./", "../")) or reference in (".", "..")


def short_name(reference: str) -> str:
    if reference.lower().endswith(GGUF_SUFFIX):  # a path or org/name/file.gguf: the file says which quantization
        return PurePosixPath(reference).name[: -len(GGUF_SUFFIX)] or reference
    if not is_path(reference):
        return reference
    snapshot = _HF_SNAPSHOT.search(reference)
    if snapshot:
        return snapshot.group(1).replace("--", "/")
    return PurePosixPath(reference.rstrip("/")).name or reference


def display_names(references: Iterable[str]) -> dict[str, str]:
    """Reference -> display name; names that collide get a suffix: the parent folder, else a number."""
    names = {ref: short_name(ref) for ref in sorted(set(references))}
    by_name: dict[str, list[str]] = defaultdict(list)
    for ref, name in names.items():
        by_name[name].append(ref)
    for name, refs in by_name.items():
        if len(refs) < 2:
            continue
        parents = [_parent_name(ref) for ref in refs]
        distinct = all(parents) and len(set(parents)) == len(refs)
        for index, ref in enumerate(refs, 1):
            names[ref] = f"{name} ({parents[index - 1] if distinct else index})"
    return names


def _parent_name(reference: str) -> str:
    """A path's folder; a GGUF file on the Hub (`org/name/file.gguf`): its repo's name."""
    if is_path(reference):
        return PurePosixPath(reference.rstrip("/")).parent.name
    parts = reference.split("/")
    return parts[1] if reference.lower().endswith(GGUF_SUFFIX) and len(parts) > 2 else ""


def file_stem(name: str) -> str:
    """A display name as part of a file name: `meta-llama/Llama-3.1-8B` -> `meta-llama_Llama-3.1-8B`."""
    return _UNSAFE_IN_FILE_NAMES.sub("_", name).strip("_") or "model"
