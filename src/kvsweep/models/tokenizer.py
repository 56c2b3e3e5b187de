"""The model's own tokenizer, from the same place as its weights: a local folder, a Hub cache snapshot, the Hub.

The driver asks `tokenizer_problem` before Ray starts (to choose what each model is fed); a cell calls
`load_tokenizer` the same way. Transformers is imported inside the functions: a sweep of bundled
presets never loads a tokenizer, and its driver should not pay for importing Transformers.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvsweep.errors import first_line
from kvsweep.models.gguf_source import hub_gguf
from kvsweep.models.resolve import ModelRef, cached_model, pretrained_args

PRESET_HAS_NONE = "a bundled preset has random weights and no tokenizer"
REASON_CHARS = 200


def load_tokenizer(ref: ModelRef, trust_remote_code: bool) -> Any:
    """The tokenizer for `ref`; raises what Transformers raises when there is none (a preset raises ValueError)."""
    if ref.kind == "preset":
        raise ValueError(f"{ref.reference}: {PRESET_HAS_NONE}")
    from transformers import AutoTokenizer

    source, gguf = pretrained_args(ref)  # a GGUF file carries its tokenizer
    return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **gguf)


def tokenizer_problem(ref: ModelRef, trust_remote_code: bool) -> str | None:
    """None when the tokenizer loads, else why not, in one short line (for a reason tag and a config error)."""
    if ref.kind == "preset":
        return PRESET_HAS_NONE
    if ref.kind == "hub" and hub_gguf(ref.reference):
        cached = cached_model(ref.reference)
        if cached is None:  # probing it would download the whole file here; the cell reads it once fetched
            return None  # (a GGUF file carries its tokenizer: llama.cpp needs it too)
        ref = ModelRef(str(cached), "local")
    try:
        with _transformers_quiet():
            load_tokenizer(ref, trust_remote_code)
    except Exception as exc:  # whatever a broken folder or an unreachable Hub raises, told in one line
        if ref.kind == "local" and not _has_tokenizer_files(Path(ref.reference)):
            return "its folder has no tokenizer files (tokenizer.json, tokenizer_config.json)"
        return f"{type(exc).__name__}: {first_line(exc, REASON_CHARS)}"[:REASON_CHARS]
    return None


def _has_tokenizer_files(folder: Path) -> bool:
    """What `tokenizer.save_pretrained` writes (a slow tokenizer's vocabulary files count too)."""
    if not folder.is_dir():
        return True  # a file, not a folder: Transformers' own message says more
    patterns = ("tokenizer*", "vocab*", "*.model", "merges.txt")
    return any(any(folder.glob(pattern)) for pattern in patterns)


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """A probe that fails is reported in one line of ours; Transformers' own warnings about it would add more."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)
