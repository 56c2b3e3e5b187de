"""A GGUF file (llama.cpp's format) as a model source: which references are one, whether it can be swept, its record.

`grid.models` takes a local `.gguf` file or, on the Hub, `org/name/file.gguf` (repo id, then the file's path).
Transformers loads it (`gguf_file=`) dequantizing every tensor into the cell's dtype, so a cell measures dense
inference, not llama.cpp's; the file's quantization (`Q4_K_M`...) is recorded as where the weights came from
(`weights_origin`), never as a checkpoint quantized already.
"""

import copy
import functools
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsweep.errors import first_line
from kvsweep.model_names import GGUF_SUFFIX, is_path
from kvsweep.models.gguf_header import GgufHeader, NotGguf, read_gguf_header

if TYPE_CHECKING:
    from transformers import PretrainedConfig

GGUF_PACKAGE, MIN_GGUF = "gguf", (0, 10)  # what Transformers' GGUF loader imports, and its oldest version
INSTALL_GGUF = "pip install 'kvsweep[gguf]'"
# A cell's environment record of a GGUF model's weights (`kvsweep.env.<key>` on its MLflow run).
WEIGHTS_ORIGIN, GGUF_FILE, GGUF_TYPE = "weights_origin", "gguf_file", "gguf_type"
GGUF_ORIGIN = "gguf"
# Tensors llama.cpp stores that Transformers computes itself (rotary frequency tables): buffers, not parameters.
NOT_PARAMETERS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})
HEAD = "output.weight"  # llama.cpp's output projection; absent when it is tied to the embeddings


def is_gguf(reference: str) -> bool:
    return reference.lower().endswith(GGUF_SUFFIX)


def hub_gguf(reference: str) -> tuple[str, str] | None:
    """`org/name/file.gguf` as (repo id, the file's path in the repo); None for a path or any other reference."""
    if not is_gguf(reference) or is_path(reference):
        return None
    parts = reference.split("/")
    if len(parts) < 3 or not all(parts):
        return None
    return "/".join(parts[:2]), "/".join(parts[2:])


def gguf_problem(reference: str) -> str | None:
    """Why a `.gguf` reference cannot be swept, in one short line; None when it can (or is no GGUF reference).
    A Hub file not on this machine is checked on each node once fetched (`driver/hub_prefetch.py`)."""
    if not is_gguf(reference):
        return None
    if missing := package_problem():
        return missing
    path = Path(reference).expanduser()
    if not path.exists():
        if hub_gguf(reference):
            return None
        return "no such file (a GGUF model is a .gguf file on this machine, or org/name/file.gguf on the Hub)"
    return file_problem(path)


def package_problem() -> str | None:
    """Transformers reads GGUF tensors through the `gguf` package: why it cannot here, or None."""
    try:
        version = metadata.version(GGUF_PACKAGE)
    except metadata.PackageNotFoundError:
        return f"loading a GGUF file needs the gguf package, which is not installed: {INSTALL_GGUF}"
    found = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if found < MIN_GGUF:
        wanted = ".".join(map(str, MIN_GGUF))
        return f"loading a GGUF file needs gguf>={wanted}, and gguf {version} is installed: {INSTALL_GGUF}"
    return None


def file_problem(path: Path) -> str | None:
    """Why the file at `path` cannot be loaded by Transformers as a causal LM from GGUF, or None."""
    if not path.is_file():
        return "it is a folder, not a .gguf file"
    try:
        header = read_gguf_header(path)
    except NotGguf as exc:
        return f"not a GGUF file: {exc}"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    import transformers

    try:
        config = gguf_config(path)
    except Exception as exc:  # Transformers' own refusal, e.g. "GGUF model with architecture X is not supported yet."
        return (
            f"Transformers {transformers.__version__} cannot load its architecture {header.architecture!r} "
            f"from GGUF ({first_line(exc, 200)})"
        )
    if not generates(config):
        return f"its architecture {header.architecture!r} loads as {config.model_type!r}, not a causal language model"
    return None


def generates(config: "PretrainedConfig") -> bool:
    """Whether `AutoModelForCausalLM` has a class for this config (an encoder such as T5 has none)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def gguf_config(path: Path) -> "PretrainedConfig":
    """The config Transformers builds from the file's metadata (what `from_pretrained` builds the model from);
    read once per file and process: the pre-Ray check, the planner and the fetch task all ask for it."""
    stat = path.stat()
    return copy.deepcopy(_gguf_config(str(path.resolve()), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=32)
def _gguf_config(path: str, size: int, mtime_ns: int) -> "PretrainedConfig":
    from transformers import AutoConfig

    file = Path(path)
    return AutoConfig.from_pretrained(str(file.parent), gguf_file=file.name)


def gguf_parameters(header: GgufHeader, tied: bool) -> int:
    """The model's parameter count from the header's tensor shapes: every tensor the model holds as a weight
    (not the rotary tables llama.cpp stores), the output head once when it is tied to the embeddings."""
    return sum(t.elements for t in header.tensors if t.name not in NOT_PARAMETERS and not (tied and t.name == HEAD))


def weights_origin(path: str) -> dict[str, str]:
    """A cell's record of where its weights came from: a GGUF file's name and quantization type (its weights
    were dequantized into the cell's dtype as they loaded); {} for any other model."""
    if not is_gguf(path):
        return {}
    header = read_gguf_header(path)
    return {WEIGHTS_ORIGIN: GGUF_ORIGIN, GGUF_FILE: Path(path).name, GGUF_TYPE: header.quantization}


def dequantizing() -> dict[str, Any]:
    """`from_pretrained`'s options that load a GGUF file's weights dense, in the dtype asked for. Transformers
    may otherwise keep some architectures' blocks packed (and swap in ggml's attention) where its `kernels`
    package finds a GGUF kernel: a cell would then measure another model than the one planned."""
    try:
        from transformers import GgufConfig
    except ImportError:  # a Transformers without packed GGUF weights: it always dequantizes
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def gguf_weights_problem(model: str, gguf_type: str | None, asked: str) -> str:
    """Why `grid.weights` cannot quantize a GGUF model: Transformers refuses a `quantization_config` with
    `gguf_file=`, and the file is quantized already (its weights load dequantized)."""
    what = f"a GGUF file quantized already ({gguf_type})" if gguf_type else "a GGUF file"
    return (
        f"grid.weights: {asked} asked for {model}, {what}; Transformers loads it dequantized and cannot "
        "quantize it again: sweep it with grid.weights=[none]"
    )
