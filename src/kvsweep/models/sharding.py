"""How a cell's model is split over its GPUs, and what each of them is predicted to hold.

Each GPU gets a contiguous run of decoder layers (a pipeline; placement rules in docs/cluster.md), and each
layer's cache lives where its layer runs: Transformers creates a cache layer on the device of its first keys. The
split minimises the largest GPU's predicted peak: its weights, its layers' cache, the working set every GPU needs
(prefill activations, the copies of its largest layer's K/V that attention makes) and, with the head, the logits.
The planner and the cell both call `split_layers`, so what is predicted is what is placed. No torch: a plan for
8 GPUs is made on a laptop.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerCosts:
    """Bytes by where they sit in the model: the split's input."""

    first: int  # weights before the decoder layers (embeddings)
    last: int  # weights after them (final norm; the head unless tied)
    weights: tuple[int, ...]  # each decoder layer's weights
    kv: tuple[int, ...]  # each layer's cache bytes kept on its GPU
    moved_kv: tuple[int, ...]  # an offloaded cache: each layer's bytes brought to its GPU in turn (else 0s)
    device_layers: int  # how many moved layers a GPU holds at once (the one in use and the one prefetched)
    working: int  # every GPU while its layers run: prefill activations
    layer_working: tuple[int, ...]  # each layer's transient K/V copies; a GPU needs its largest layer's
    head_working: int  # the logits, on the GPU that holds the head
    head_on_first: bool  # the head is tied to the embeddings: it runs on the first GPU


@dataclass(frozen=True)
class GpuLoad:
    """One GPU's share of a cell: its layers and its predicted bytes."""

    gpu: int
    layers: range
    weights_bytes: int
    kv_bytes: int
    working_bytes: int
    holds_head: bool

    @property
    def peak_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.working_bytes


def split_layers(costs: LayerCosts, gpus: int) -> tuple[GpuLoad, ...]:
    """Contiguous layer ranges, one per GPU, with the smallest possible largest peak: exact, by dynamic
    programming over the split points (O(GPUs x layers^2); ties keep earlier GPUs' ranges short)."""
    layers = len(costs.weights)
    if gpus < 1 or gpus > layers:
        raise ValueError(f"cannot place {layers} decoder layers on {gpus} GPUs: each GPU needs at least one layer")
    # best[g][s]: (largest peak, end of GPU g's range) placing layers s.. on GPUs g..; filled from the last GPU
    best: list[dict[int, tuple[int, int]]] = [{} for _ in range(gpus)]
    for start in range(gpus - 1, layers):
        best[gpus - 1][start] = (load(costs, gpus - 1, gpus, range(start, layers)).peak_bytes, layers)
    for gpu in range(gpus - 2, -1, -1):
        for start in range(gpu, layers - (gpus - 1 - gpu)):
            best[gpu][start] = min(
                (max(peak, best[gpu + 1][end][0]), end)
                for end, peak in _peaks_from(costs, gpu, gpus, start, layers - (gpus - 1 - gpu))
            )
    loads, start = [], 0
    for gpu in range(gpus):
        end = best[gpu][start][1]
        loads.append(load(costs, gpu, gpus, range(start, end)))
        start = end
    return tuple(loads)


def _peaks_from(costs: LayerCosts, gpu: int, gpus: int, start: int, stop: int) -> list[tuple[int, int]]:
    """(end, peak) of GPU `gpu` running layers start..end-1, for every end up to `stop`, kept as running sums."""
    fixed = load(costs, gpu, gpus, range(start, start))  # the GPU's share that no layer changes
    summed, widest, moved, found = 0, 0, [0] * costs.device_layers, []
    for end in range(start + 1, stop + 1):
        i = end - 1
        summed += costs.weights[i] + costs.kv[i]
        widest = max(widest, costs.layer_working[i])
        if costs.device_layers and costs.moved_kv[i] > moved[-1]:
            moved = sorted([*moved[:-1], costs.moved_kv[i]], reverse=True)
        found.append((end, fixed.peak_bytes + summed + widest + sum(moved)))
    return found


def load(costs: LayerCosts, gpu: int, gpus: int, layers: range) -> GpuLoad:
    """What GPU `gpu` of `gpus` holds when it runs `layers`."""
    head_gpu = 0 if costs.head_on_first else gpus - 1
    weights = sum(costs.weights[i] for i in layers)
    weights += (costs.first if gpu == 0 else 0) + (costs.last if gpu == gpus - 1 else 0)
    moved = sorted((costs.moved_kv[i] for i in layers), reverse=True)[: costs.device_layers]
    kv = sum(costs.kv[i] for i in layers) + sum(moved)
    working = costs.working + max((costs.layer_working[i] for i in layers), default=0)
    working += costs.head_working if gpu == head_gpu else 0
    return GpuLoad(gpu, layers, weights, kv, working, gpu == head_gpu)


def layers_text(loads: Sequence[GpuLoad]) -> str:
    """`0-39 | 40-79`: each GPU's layers, the placement as a cell records it."""
    return " | ".join(f"{r.layers.start}-{r.layers.stop - 1}" for r in loads)
