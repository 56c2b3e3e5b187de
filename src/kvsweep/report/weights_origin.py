"""The report's note on weights that came from GGUF files: what was measured is not what llama.cpp runs.

Transformers dequantizes a GGUF file's tensors into the cell's dtype as it loads them, so those cells
measure Transformers' inference on dense weights (their speed and memory are a dense model's), while
the file's quantization still shapes their quality. Someone reading `Q4_K_M` in a model's name could
take the numbers for llama.cpp's; the note says they are not. Read from each cell's environment record
(`models/gguf_source.py`), so a report rebuilt from MLflow says the same.
"""

from collections.abc import Sequence

from kvsweep.models.gguf_source import GGUF_FILE, GGUF_ORIGIN, GGUF_TYPE, WEIGHTS_ORIGIN
from kvsweep.report.selection import Decision


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
