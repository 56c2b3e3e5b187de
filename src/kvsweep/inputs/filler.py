"""Filler text for long prompts: prose paragraphs from the docstrings of Python's own standard library.

Retrieval in a long context is only a test when the text around the needle is varied: one sentence
repeated makes attention trivial and hides what a lossy cache does to it. Every Python install ships
megabytes of hand-written English in its modules' docstrings; they are read here with `ast` (nothing
is imported, nothing downloaded), cut into paragraphs, and the prose ones kept, in a fixed order.

Parsing the library takes seconds, so the corpus is kept on disk per Python version
(`~/.cache/kvsweep/`, or `KVSWEEP_CACHE_DIR`); a cell reads it in milliseconds. The same Python gives
the same corpus on every node, and a cell's `inputs_sha256` shows any difference.
"""

import ast
import functools
import hashlib
import json
import os
import platform
import sysconfig
from pathlib import Path

# Folders of the standard library whose docstrings are not prose meant for readers (test suites,
# demos, codec tables) or not part of every install.
SKIPPED_FOLDERS = frozenset(
    {
        "test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages", "dist-packages",
        "tkinter", "ensurepip", "pydoc_data", "encodings", "__pycache__", "__phello__",
    }
)  # fmt: skip
MIN_PARAGRAPH_CHARS = 80
MIN_PROSE_SHARE = 0.9  # letters and spaces among a paragraph's characters: prose, not code or tables
CORPUS_VERSION = 1  # bump when the rules above change: the disk copy is rebuilt


def cache_dir() -> Path:
    return Path(os.environ.get("KVSWEEP_CACHE_DIR") or Path.home() / ".cache" / "kvsweep")


@functools.cache
def filler_paragraphs() -> tuple[str, ...]:
    """The corpus: the library's prose paragraphs, deduplicated, in file and source order."""
    path = cache_dir() / f"filler-v{CORPUS_VERSION}-python{platform.python_version()}.json"
    try:
        return tuple(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    paragraphs = read_stdlib_paragraphs(Path(sysconfig.get_paths()["stdlib"]))
    if not paragraphs:
        raise RuntimeError(f"no docstring prose found under {sysconfig.get_paths()['stdlib']} for filler text")
    _write_atomically(path, json.dumps(paragraphs))
    return tuple(paragraphs)


def corpus_sha256() -> str:
    return hashlib.sha256("\n\n".join(filler_paragraphs()).encode()).hexdigest()


def read_stdlib_paragraphs(root: Path) -> list[str]:
    """Prose paragraphs of every docstring under `root`, sorted by file, each once."""
    seen: dict[str, None] = {}
    for source in sorted(root.rglob("*.py")):
        if SKIPPED_FOLDERS & set(source.relative_to(root).parts[:-1]):
            continue
        for paragraph in _docstring_paragraphs(source):
            seen.setdefault(paragraph, None)
    return list(seen)


def _docstring_paragraphs(source: Path) -> list[str]:
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for block in (ast.get_docstring(node) or "").split("\n\n"):
                paragraph = " ".join(block.split())
                if is_prose(paragraph):
                    found.append(paragraph)
    return found


def is_prose(paragraph: str) -> bool:
    if len(paragraph) < MIN_PARAGRAPH_CHARS:
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    return letters / len(paragraph) >= MIN_PROSE_SHARE


def _write_atomically(path: Path, text: str) -> None:
    """Several cells may build the corpus at once: each writes its own file and renames it into place."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError:  # a read-only home: the corpus is rebuilt per process instead
        pass
