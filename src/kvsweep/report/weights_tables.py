"""Quantized weights and a quantized KV cache, measured apart: the 2 x 2 a 4-bit deployment needs.

A 4-bit model does not mean a 4-bit cache, and the two save memory, cost speed and lose quality for different
reasons. Where a sweep has more than one `grid.weights` value for a request, its cells are laid out as weights
(rows) x cache (columns), each against 16-bit weights with `dynamic`. Memory on a CPU is the process's peak
resident memory, since the weights are in it (the cache's own bytes would not show what quantizing weights saved).
Quality is task accuracy (absolute: comparable across weights), and `token_agreement` with the cell's own dense
cache (what the cache alone loses, under those weights).

Also the note on GGUF weights: Transformers dequantizes them into the cell's dtype as it loads, so those cells
measure dense inference (a dense model's speed and memory, the file's quantization still shaping quality), not
llama.cpp's, whatever `Q4_K_M` in a name suggests. Read from each cell's environment record
(`models/gguf_source.py`), so a report rebuilt from MLflow says the same.
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvsweep.caches import BASELINE, get_strategy
from kvsweep.grid import NO_WEIGHT_QUANTIZATION
from kvsweep.model_names import display_names
from kvsweep.models.gguf_source import GGUF_FILE, GGUF_ORIGIN, GGUF_TYPE, WEIGHTS_ORIGIN
from kvsweep.names import Metric
from kvsweep.report.selection import Decision
from kvsweep.report.task_accuracy import task_accuracies
from kvsweep.results import OK, CellResult
from kvsweep.units import MIB

Request = tuple[str, str, int, int, int, str]  # model, dtype, batch, context, new tokens, inputs


@dataclass(frozen=True)
class WeightsKvTable:
    title: str
    header: list[str]
    rows: list[list[str]]


INTRO = (
    "Each request with more than one weight quantization, as weights (rows) x KV cache (columns), against "
    "16-bit weights with the dense cache (dynamic): median time per output token, peak memory (device on GPUs, "
    "the process's resident memory on a CPU), task accuracy where the cells answered a task, and agreement with "
    "the cell's own dense cache (what the cache alone loses under those weights)."
)


def weights_kv_tables(results: list[CellResult]) -> list[WeightsKvTable]:
    """One table per request whose cells differ in weights; [] when no request does."""
    requests: dict[Request, list[CellResult]] = defaultdict(list)
    for result in results:
        if not result.cell.compile:
            c = result.cell
            requests[(c.model, c.dtype, c.batch_size, c.context_length, c.max_new_tokens, c.inputs)].append(result)
    names = display_names(key[0] for key in requests)
    tables = []
    for key in sorted(requests):
        cells = requests[key]
        weights = _ordered({r.cell.weights for r in cells}, NO_WEIGHT_QUANTIZATION)
        if len(weights) < 2:
            continue
        caches = _ordered({r.cell.cache for r in cells if _kv_column(r.cell.cache)}, BASELINE)
        by = {(r.cell.weights, r.cell.cache): r for r in cells}
        baseline = by.get((NO_WEIGHT_QUANTIZATION, BASELINE))
        model, dtype, batch, context, new, inputs = key
        title = f"{names[model]} {dtype} bs{batch} ctx{context} new{new} ({inputs} inputs)"
        rows = [[w, *(_cell_text(by.get((w, cache)), baseline) for cache in caches)] for w in weights]
        tables.append(WeightsKvTable(title, ["weights \\ KV cache", *caches], rows))
    return tables


def _kv_column(cache: str) -> bool:
    """The dense baseline and every quantized cache: the other strategies are the selection's business."""
    return cache == BASELINE or get_strategy(cache).backend is not None


def _ordered(values: set[str], first: str) -> list[str]:
    return sorted(values, key=lambda v: (v != first, v))


def memory_of(result: CellResult) -> float | None:
    return result.metrics.get(Metric.PEAK_DEVICE_MEM_BYTES) or result.metrics.get(Metric.PEAK_HOST_RSS_BYTES)


def _cell_text(result: CellResult | None, baseline: CellResult | None) -> str:
    if result is None:
        return "-"
    if result.status != OK:
        return result.status
    parts = []
    tpot, memory = result.metrics.get(Metric.TPOT_MS), memory_of(result)
    if tpot is not None:
        parts.append(f"{tpot:.2f} ms/token{_ratio(tpot, baseline and baseline.metrics.get(Metric.TPOT_MS))}")
    if memory is not None:
        parts.append(f"{memory / MIB:.0f} MiB{_ratio(memory, baseline and memory_of(baseline))}")
    parts += [f"{accuracy.task} {accuracy.value:.2f}" for accuracy in task_accuracies(result.metrics)]
    if Metric.TOKEN_AGREEMENT in result.metrics and result.cell.cache != BASELINE:
        parts.append(f"agreement {result.metrics[Metric.TOKEN_AGREEMENT]:.2f}")
    return "; ".join(parts)


def _ratio(value: float, base: float | None) -> str:
    """` (0.52x)`: against the 16-bit, dense-cache cell; nothing when that cell has no figure."""
    return f" ({value / base:.2f}x)" if base else ""


def origin_notes(decisions: Sequence[Decision]) -> list[str]:
    """One paragraph naming each GGUF file, its quantization and the dtypes it was dequantized into; none when
    no cell loaded a GGUF file."""
    dtypes: dict[tuple[str, str], set[str]] = {}
    for decision in decisions:
        for entry in decision.entries:
            record = entry.result.environment
            if record.get(WEIGHTS_ORIGIN) == GGUF_ORIGIN:
                found = (str(record.get(GGUF_FILE, "?")), str(record.get(GGUF_TYPE, "?")))
                dtypes.setdefault(found, set()).add(entry.result.cell.dtype)
    if not dtypes:
        return []
    files = "; ".join(f"{file} ({kind}) into {', '.join(sorted(d))}" for (file, kind), d in sorted(dtypes.items()))
    return [
        f"Weights from GGUF files, dequantized by Transformers as they loaded: {files}. These cells measure "
        "Transformers' inference on dense weights, not llama.cpp's on the quantized blocks: their speed and memory "
        "are a dense model's, while the file's quantization still shapes their quality."
    ]
