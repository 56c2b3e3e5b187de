"""Where a model's weight elements are: embeddings, each decoder layer, the head.

A weight quantizer replaces `nn.Linear` modules and leaves every other parameter as it is, so a layout keeps the
two apart: the linears of each block by shape, everything else as a plain element count. Planning reads the layout
of a preset from its config alone (no torch, no Transformers); a checkpoint's layout comes from the model built on
the meta device (`layout_of_module`). Both give the same answer for a preset, block by block (tests).
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kvsweep.models.presets import Preset


@dataclass(frozen=True)
class Linear:
    in_features: int
    out_features: int
    bias: bool
    count: int = 1  # identical linears in the block

    def elements(self) -> int:
        """Weight and bias elements of all `count` linears."""
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True)
class Block:
    linears: tuple[Linear, ...] = ()  # nn.Linear modules (what weight quantizers replace), one entry per shape, sorted
    other_elements: int = 0  # every other parameter element (embeddings, norms, fused expert tensors, sinks...)

    def elements(self) -> int:
        """All parameter elements of the block: linear weights and biases, and the rest."""
        return sum(linear.elements() for linear in self.linears) + self.other_elements


@dataclass(frozen=True)
class WeightLayout:
    first: Block  # before the decoder layers (embeddings)
    layers: tuple[Block, ...]  # one per decoder layer, in order
    last: Block  # after them (final norm, lm_head unless tied to the embeddings)

    def elements(self) -> int:
        """The model's parameter count, tied weights once."""
        return sum(block.elements() for block in self.blocks())

    def blocks(self) -> tuple[Block, ...]:
        return (self.first, *self.layers, self.last)


def block(linears: Iterable[tuple[int, int, bool]], other_elements: int = 0) -> Block:
    """A block in its one canonical form: identical linears merged into a count, shapes sorted, so two layouts of
    the same model compare equal however their modules were registered."""
    counts = Counter(linears)
    merged = tuple(Linear(i, o, b, n) for (i, o, b), n in sorted(counts.items()))
    return Block(merged, other_elements)


# --- from a preset's config (torch-free) -------------------------------------------------------------------------


def layout_of_preset(preset: "Preset") -> WeightLayout:
    """The layout of the decoder families the presets use (llama, qwen2, qwen3, mistral, gemma3_text, gpt_oss),
    from the config alone, as Transformers' modeling code builds them."""
    c = preset.config
    hidden, vocab = c["hidden_size"], c["vocab_size"]
    layer = _decoder_layer(preset.model_type, c)
    head = [] if c.get("tie_word_embeddings") else [(hidden, vocab, False)]
    return WeightLayout(
        first=block([], vocab * hidden),
        layers=tuple(layer for _ in range(c["num_hidden_layers"])),
        last=block(head, hidden),
    )


def _decoder_layer(model_type: str, c: dict) -> Block:
    """One decoder layer: attention projections and MLP linears, plus norms, q/k norms, sinks, router, experts."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    q_width, kv_width = heads * head_dim, c.get("num_key_value_heads", heads) * head_dim
    attention_bias = bool(c.get("attention_bias")) and model_type != "mistral"  # mistral's projections never have one
    qkv_bias = attention_bias or model_type == "qwen2"  # qwen2: q, k, v always biased, o never
    o_bias = attention_bias and model_type != "qwen2"
    linears = [(hidden, q_width, qkv_bias), (hidden, kv_width, qkv_bias), (hidden, kv_width, qkv_bias)]
    linears.append((q_width, hidden, o_bias))
    other = (4 if model_type == "gemma3_text" else 2) * hidden  # RMSNorms around attention and MLP
    if model_type in ("qwen3", "gemma3_text"):
        other += 2 * head_dim  # q_norm, k_norm
    if model_type == "gpt_oss":
        other += heads + _experts_elements(c)  # one attention sink per head; router and fused experts
    else:
        inner, mlp_bias = c["intermediate_size"], bool(c.get("mlp_bias")) and model_type == "llama"
        linears += [(hidden, inner, mlp_bias), (hidden, inner, mlp_bias), (inner, hidden, mlp_bias)]
    return block(linears, other)


def _experts_elements(c: dict) -> int:
    """gpt-oss's MLP: a router (its own module with weight and bias, not an nn.Linear) and every expert's fused
    gate_up and down projections with biases (3-D parameters, not nn.Linear): no weight quantizer replaces them."""
    hidden, inner, experts = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    router = experts * hidden + experts
    return router + experts * (hidden * 2 * inner + 2 * inner + inner * hidden + hidden)


# --- from a built model (meta device is enough) --------------------------------------------------------------------


def layout_of_module(model: "torch.nn.Module", layers: int) -> WeightLayout:
    """The layout of a built model: its decoder's `nn.ModuleList` of `layers` modules is the layers; the modules
    registered before it are `first`, after it `last`. A tied parameter is counted once, where it first appears
    (the embeddings), so a tied lm_head adds nothing to `last`."""
    import torch

    decoder = model.get_submodule(decoder_layers(model, layers))
    order = {id(module): index for index, (_, module) in enumerate(model.named_modules())}
    decoder_index = order[id(decoder)]
    layer_of = {id(sub): i for i, layer in enumerate(decoder) for sub in layer.modules()}
    owners = _parameter_owners(model)
    linears: list[list[tuple[int, int, bool]]] = [[] for _ in range(layers + 2)]
    other = [0] * (layers + 2)
    for module, names in owners:
        slot = layer_of[id(module)] + 1 if id(module) in layer_of else (0 if order[id(module)] < decoder_index else -1)
        if isinstance(module, torch.nn.Linear) and "weight" in names:
            linears[slot].append((module.in_features, module.out_features, "bias" in names))
        else:
            other[slot] += sum(getattr(module, name).numel() for name in names)
    blocks = [block(found, count) for found, count in zip(linears, other, strict=True)]
    return WeightLayout(first=blocks[0], layers=tuple(blocks[1:-1]), last=blocks[-1])


def decoder_layers(model: "torch.nn.Module", layers: int) -> str:
    """The dotted name of the first `nn.ModuleList` of exactly `layers` modules, in registration order: the
    decoder's layers (`model.layers`)."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == layers:
            return name
    raise ValueError(f"no nn.ModuleList of {layers} decoder layers in {type(model).__name__}")


def _parameter_owners(model: "torch.nn.Module") -> list[tuple["torch.nn.Module", tuple[str, ...]]]:
    """Each module with the names of the parameters it registers itself, a tied parameter only at its first
    owner (registration order: the input embeddings before a tied lm_head)."""
    seen: set[int] = set()
    owners = []
    for module in model.modules():
        names = []
        for name, param in module.named_parameters(recurse=False):
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                names.append(name)
        if names:
            owners.append((module, tuple(names)))
    return owners
