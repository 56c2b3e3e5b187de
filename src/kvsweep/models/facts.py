"""What planning needs to know about a model (KV shapes, parameter count), as cheaply as it can be read.

Presets come from their table; a local folder with a plain `config.json` and safetensors weights
from those files (a safetensors header lists every tensor's shape, so the count is exact and
costs a few reads). Anything else (a Hub id, custom code, a quantized or multimodal checkpoint)
goes through Transformers, imported only then.
"""

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsweep.models.presets import PRESETS
from kvsweep.models.resolve import ModelRef, kv_shape, load_config, parameter_count
from kvsweep.models.shape import KvShape, shape_from_dict

# Config keys that mean the plain reading may be wrong: custom code, packed weights, nested towers.
NEEDS_TRANSFORMERS = ("auto_map", "quantization_config", "text_config")


@dataclass(frozen=True)
class ModelFacts:
    shape: KvShape
    parameters: int | None  # None when the model cannot be built on the meta device here


def read_facts(ref: ModelRef, trust_remote_code: bool = False) -> ModelFacts:
    """The model's facts; raises what reading its config raises (a typo, a missing folder, no Hub)."""
    if ref.kind == "preset":
        preset = PRESETS[ref.reference]
        shape = shape_from_dict(preset.config)
        assert shape is not None, f"preset {preset.name} lacks a shape key"
        return ModelFacts(shape, preset.parameters())
    if ref.kind == "local":
        facts = _plain_folder_facts(Path(ref.reference))
        if facts is not None:
            return facts
    config = load_config(ref, trust_remote_code)
    try:
        parameters: int | None = parameter_count(config)
    except Exception:  # custom code the meta device cannot build: no prediction, still runs
        parameters = None
    return ModelFacts(kv_shape(config), parameters)


def _plain_folder_facts(folder: Path) -> ModelFacts | None:
    """Facts from `config.json` and safetensors headers, or None if the folder needs Transformers."""
    try:
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    weights = sorted(folder.glob("*.safetensors"))
    shape = shape_from_dict(config)
    if shape is None or not weights or any(key in config for key in NEEDS_TRANSFORMERS):
        return None
    try:
        return ModelFacts(shape, sum(safetensors_elements(path) for path in weights))
    except (OSError, ValueError, KeyError, struct.error):
        return None


def safetensors_elements(path: Path) -> int:
    """Number of elements stored in a safetensors file, from its header (8-byte length, then JSON)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
    return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
