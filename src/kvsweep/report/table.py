"""The results table: a compact terminal view and the CSV logged on the sweep's parent run."""

import csv
import io
from collections.abc import Iterable

from kvsweep.caches import cache_rank
from kvsweep.grid import CELL_FIELDS
from kvsweep.model_names import display_names
from kvsweep.results import CellResult

CSV_METRICS = (
    "ttft_ms",
    "ttft_ms_ci_low",
    "ttft_ms_ci_high",
    "ttft_ms_p90",
    "tpot_ms",
    "tpot_ms_ci_low",
    "tpot_ms_ci_high",
    "tpot_ms_p90",
    "decode_tokens_per_s",
    "prefill_tokens_per_s",
    "e2e_ms",
    "e2e_ms_ci_low",
    "e2e_ms_ci_high",
    "first_call_ms",
    "kv_cache_bytes",
    "kv_cache_bytes_dense",
    "peak_device_mem_bytes",
    "peak_host_rss_bytes",
    "token_agreement",
    "first_divergence",
    "repeats",
    "discarded_calls",
    "host_other_cpu_share",
    "host_steal_share",
)
MIB = 1024 * 1024


def results_csv(results: Iterable[CellResult]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["cell_id", *CELL_FIELDS, "status", "error", "contended", "contention", *CSV_METRICS])
    for r in results:
        writer.writerow(
            [
                r.cell_id,
                *(r.cell[f] for f in CELL_FIELDS),
                r.status,
                r.error,
                r.tags.get("kvsweep.contended", "unknown"),
                r.tags.get("kvsweep.contention", ""),
                *(r.metrics.get(m, "") for m in CSV_METRICS),
            ]
        )
    return out.getvalue()


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def results_table(results: Iterable[CellResult]) -> str:
    """One line per cell, sorted like the grid, numbers in the units people read (models by display name)."""
    results = list(results)
    names = display_names(r.cell["model"] for r in results)
    header = [
        "model",
        "dtype",
        "ctx",
        "bs",
        "new",
        "cache",
        "status",
        "ttft ms",
        "tpot ms",
        "tok/s",
        "kv MiB",
        "dense MiB",
        "peak MiB",
        "agree",
    ]
    rows = [header]
    for r in sorted(results, key=_order):
        m = r.metrics
        peak = m.get("peak_device_mem_bytes", m.get("peak_host_rss_bytes"))
        cache = r.cell["cache"] + ("+compile" if r.cell["compile"] else "")
        status = r.status + ("*" if r.tags.get("kvsweep.contended") == "true" else "")
        status += "!" if r.tags.get("kvsweep.implausible") == "true" else ""
        rows.append(
            [
                names[r.cell["model"]],
                r.cell["dtype"],
                str(r.cell["context_length"]),
                str(r.cell["batch_size"]),
                str(r.cell["max_new_tokens"]),
                cache,
                status,
                _fmt(m.get("ttft_ms"), digits=2),
                _fmt(m.get("tpot_ms"), digits=2),
                _fmt(m.get("decode_tokens_per_s"), digits=0),
                _fmt(m.get("kv_cache_bytes"), MIB, 2),
                _fmt(m.get("kv_cache_bytes_dense"), MIB, 2),
                _fmt(peak, MIB, 0),
                _fmt(m.get("token_agreement"), digits=2),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    notes = [
        f"  {r.status}: {r.cell['cache']} ctx={r.cell['context_length']} bs={r.cell['batch_size']} "
        f"{r.cell['dtype']} {names[r.cell['model']]}: {r.error}"
        for r in sorted(results, key=_order)
        if r.error
    ]
    if any(r.tags.get("kvsweep.contended") == "true" for r in results):
        notes.append(
            "  * measured while other processes took the cell's CPUs or shared its GPU "
            "(tag kvsweep.contended=true; kvsweep.contention says what was seen)"
        )
    if any(r.tags.get("kvsweep.implausible") == "true" for r in results):
        notes.append("  ! decode faster than the device's memory bandwidth allows (tag kvsweep.implausible=true)")
    return "\n".join(lines + (["", *notes] if notes else []))


def _order(r: CellResult) -> tuple:
    c = r.cell
    return (
        c["model"],
        c["dtype"],
        c["batch_size"],
        c["context_length"],
        c["max_new_tokens"],
        *cache_rank(c["cache"]),
        c["compile"],
    )
