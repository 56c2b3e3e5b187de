"""What planning needs to know about a model (KV shapes, parameter count), as cheaply as it can be read.

Presets from their table; a local folder with a plain `config.json` and safetensors from those files (a header
lists every tensor's shape: an exact count for a few reads); a GGUF file from its header likewise
(`models/gguf_source.py`). Anything else (a Hub id, custom code, a quantized or multimodal checkpoint) goes
through Transformers, imported only then.
"""

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsweep.models.gguf_header import read_gguf_header
from kvsweep.models.gguf_source import file_problem, gguf_parameters, is_gguf
from kvsweep.models.presets import PRESETS, Preset
from kvsweep.models.quantize_weights import prequantized_label
from kvsweep.models.resolve import ModelRef, cached_model, kv_shape, load_config, meta_model
from kvsweep.models.shape import KvShape, shape_from_dict
from kvsweep.models.weight_layout import WeightLayout, layout_of_module, layout_of_preset

# Config keys that mean the plain reading may be wrong: custom code, packed weights, nested towers.
NEEDS_TRANSFORMERS = ("auto_map", "quantization_config", "text_config")
PRESET_FAMILIES = frozenset(p.model_type for p in PRESETS.values())  # whose layout `layout_of_preset` knows


@dataclass(frozen=True)
class ModelFacts:
    shape: KvShape
    parameters: int | None  # None when the model cannot be built on the meta device here
    layout: WeightLayout | None = None  # where the weights are, layer by layer; None: not known here
    prequantized: str | None = None  # the checkpoint's own weight quantization (`awq-int4`, `fp8`...); None: none
    gguf_type: str | None = None  # a GGUF file's quantization (`Q4_1`...), its weights dequantized as they load
    stand_in: str = ""  # a Hub id planned offline: the bundled preset with its shapes whose facts these are

    @property
    def planned_parameters(self) -> int | None:
        """The count the planner sizes weights from: none for a checkpoint quantized already, whose packed bytes
        no 16-bit count predicts (the plan then skips nothing on a guess)."""
        return None if self.prequantized else self.parameters


def read_facts(ref: ModelRef, trust_remote_code: bool = False) -> ModelFacts:
    """The model's facts; raises what reading its config raises (a typo, a missing folder, no Hub)."""
    if ref.kind == "preset":
        preset = PRESETS[ref.reference]
        shape = shape_from_dict({"model_type": preset.model_type, **preset.config})
        assert shape is not None, f"preset {preset.name} lacks a shape key"
        return ModelFacts(shape, preset.parameters(), layout_of_preset(preset))
    if is_gguf(ref.reference):
        return gguf_facts(ref)
    if ref.kind == "local":
        facts = _plain_folder_facts(Path(ref.reference))
        if facts is not None:
            return facts
    config = load_config(ref, trust_remote_code)
    prequantized = prequantized_label(config.to_dict())
    try:
        model = meta_model(config)  # built once: the count and the layout both read it
    except Exception:  # custom code the meta device cannot build: no prediction, still runs
        return ModelFacts(kv_shape(config), None, prequantized=prequantized)
    parameters = sum(p.numel() for p in model.parameters())
    try:
        layers = config.get_text_config(decoder=True).num_hidden_layers
        layout: WeightLayout | None = layout_of_module(model, layers)
    except ValueError:  # no list of decoder layers found: a split over GPUs spreads the count evenly
        layout = None
    return ModelFacts(kv_shape(config), parameters, layout, prequantized)


def gguf_facts(ref: ModelRef) -> ModelFacts:
    """A GGUF file's facts: the count from its header's tensor shapes (exact), the shape from the config Transformers
    builds from it. A Hub file is read from this machine's Hub cache, never downloaded here: until the nodes have
    fetched it, this raises and the plan is made again from their reading (`driver/hub_prefetch.py`)."""
    path = Path(ref.reference) if ref.kind == "local" else cached_model(ref.reference)
    if path is None:
        raise FileNotFoundError("not in this machine's Hub cache yet: its header is read once the nodes fetch it")
    if problem := file_problem(path):
        raise ValueError(problem)
    header, config = read_gguf_header(path), load_config(ModelRef(str(path), "local"))
    text = config.get_text_config(decoder=True)
    parameters = gguf_parameters(header, bool(getattr(text, "tie_word_embeddings", False)))
    try:
        layout: WeightLayout | None = layout_of_module(meta_model(config), text.num_hidden_layers)
    except Exception:  # a model the meta device cannot build, or no list of decoder layers: spread evenly
        layout = None
    if layout is not None and layout.elements() != parameters:
        layout = None  # it would place weights the file does not hold
    return ModelFacts(kv_shape(config), parameters, layout, gguf_type=header.quantization)


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
        parameters = sum(safetensors_elements(path) for path in weights)
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return ModelFacts(shape, parameters, _family_layout(config, parameters))


def _family_layout(config: dict[str, Any], parameters: int) -> WeightLayout | None:
    """A folder of a family the presets describe gets their layout, when it accounts for every stored weight."""
    if config.get("model_type") not in PRESET_FAMILIES:
        return None
    try:
        layout = layout_of_preset(Preset("local", config["model_type"], config))
    except (KeyError, TypeError):
        return None
    return layout if layout.elements() == parameters else None


def safetensors_elements(path: Path) -> int:
    """Number of elements stored in a safetensors file, from its header (8-byte length, then JSON)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
    return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
