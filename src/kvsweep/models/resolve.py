"""Turn a model reference (preset, local path, Hub id) into a Transformers config, without loading weights.

The model's own tokenizer comes from the same place as its weights. The driver asks `tokenizer_problem`
before Ray starts (to choose what each model is fed); a cell calls `load_tokenizer`. Transformers is
imported inside the functions: a sweep of bundled presets never pays for importing it in the driver."""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvsweep.errors import first_line
from kvsweep.models.gguf_source import gguf_config, hub_gguf, is_gguf
from kvsweep.models.presets import PRESETS
from kvsweep.models.shape import KvShape, cache_layer_types, expert_routing, layer_layout

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from kvsweep.models.weight_layout import WeightLayout

ModelKind = Literal["preset", "local", "hub"]


@dataclass(frozen=True)
class ModelRef:
    reference: str
    kind: ModelKind


def classify(reference: str) -> ModelRef:
    """Presets win over paths; anything that exists on disk is local; the rest is a Hub id."""
    if reference in PRESETS:
        return ModelRef(reference, "preset")
    if Path(reference).expanduser().exists():
        return ModelRef(str(Path(reference).expanduser().resolve()), "local")
    return ModelRef(reference, "hub")


def load_config(ref: ModelRef, trust_remote_code: bool = False) -> "PretrainedConfig":
    """The model's config: built from the preset, or read from the folder / Hub (a GGUF file: from its metadata)."""
    from transformers import AutoConfig

    if ref.kind == "preset":
        preset = PRESETS[ref.reference]
        return AutoConfig.for_model(preset.model_type, **preset.config)
    if ref.kind == "local" and is_gguf(ref.reference):
        return gguf_config(Path(ref.reference))
    source, gguf = pretrained_args(ref)
    return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **gguf)


def pretrained_args(ref: ModelRef) -> tuple[str, dict[str, str]]:
    """What `from_pretrained` reads `ref` from: its folder or Hub id and, for a GGUF file, `gguf_file=` the
    file's name there (a Hub one: its path in the repo)."""
    if not is_gguf(ref.reference):
        return ref.reference, {}
    if ref.kind == "hub" and (found := hub_gguf(ref.reference)):
        repo, file = found
        return repo, {"gguf_file": file}
    path = Path(ref.reference)
    return str(path.parent), {"gguf_file": path.name}


def kv_shape(config: "PretrainedConfig") -> KvShape:
    """The same description `models.shape.shape_from_dict` reads from a plain config, here from Transformers' own
    per-layer types (`get_layer_types_and_kwargs`, what its caches are built from): a kind kvsweep does not know
    is counted as full attention, and kept by name (`layer_types`) for the caches that refuse it."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    layer_types, layer_kwargs = get_layer_types_and_kwargs(text)
    windows = [kwargs.get("sliding_window") for kwargs in layer_kwargs]
    model_type = getattr(text, "model_type", None)
    # unknown kinds, and a window Transformers left unset, count as full attention
    layout = layer_layout(layer_types, text.to_dict(), model_type, windows, unknown_is_full=True) or ((), ())
    return KvShape(
        layers=text.num_hidden_layers,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        max_positions=getattr(text, "max_position_embeddings", None),
        hidden_size=text.hidden_size,
        intermediate_size=getattr(text, "intermediate_size", 0) or 4 * text.hidden_size,
        vocab_size=text.vocab_size,
        layer_windows=layout[0],
        state_elements=layout[1],
        layer_types=cache_layer_types(layer_types),
        query_heads=heads,
        **expert_routing(text.to_dict(), model_type),
    )


def meta_model(config: "PretrainedConfig") -> "PreTrainedModel":
    """The model built on the meta device, its tied weights tied: shapes and names, no memory, no time."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    return model


def weight_layout(config: "PretrainedConfig") -> "WeightLayout":
    """Where the weights are, layer by layer (tied weights once), from a model built on the meta device."""
    from kvsweep.models.weight_layout import layout_of_module

    return layout_of_module(meta_model(config), config.get_text_config(decoder=True).num_hidden_layers)


def hub_cache_folder(repo_id: str, cache_dir: str | None = None) -> Path:
    """Where the Hub cache keeps `repo_id` (`models--org--name`): under `cache_dir`, else this process's
    HF_HUB_CACHE (HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(cache_dir or constants.HF_HUB_CACHE).expanduser() / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, cache_dir: str | None = None) -> Path | None:
    """The cached snapshot folder of `repo_id` that its `main` ref names, or None when there is none: the
    files a prefetched model is loaded from, with no request to the Hub."""
    folder = hub_cache_folder(repo_id, cache_dir)
    try:
        commit = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = folder / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def hub_repo(reference: str) -> str:
    """The Hub repo a Hub reference lives in: itself, or for `org/name/file.gguf` the repo `org/name`."""
    found = hub_gguf(reference)
    return found[0] if found else reference


def cached_model(reference: str, cache_dir: str | None = None) -> Path | None:
    """Where a fetched Hub model is read from, with no request to the Hub: its cached snapshot folder (a GGUF
    file: the file in it), or None when the cache has none."""
    snapshot = cached_snapshot(hub_repo(reference), cache_dir)
    found = hub_gguf(reference)
    if snapshot is None or found is None:
        return snapshot
    file = snapshot / found[1]
    return file if file.is_file() else None


PRESET_HAS_NONE = "a bundled preset has random weights and no tokenizer"
REASON_CHARS = 200


UNREACHABLE = ("couldn't connect", "offline mode", "offline_mode", "connection", "max retries", "name resolution")


def hub_unreachable(message: str) -> bool:
    """Whether a Hub lookup failed for want of the Hub here (offline mode, no connection), not for a wrong id."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    return offline or any(part in message.lower() for part in UNREACHABLE)


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
