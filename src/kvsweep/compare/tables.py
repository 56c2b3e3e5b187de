"""The comparison as text: its header (what was compared, what differs, what a verdict means), the rows
in reading order (regressions first) and the counts. The terminal, compare.md and compare.html all
print these same lines and cells.
"""

import math
from collections import Counter

from kvsweep.compare.comparison import CELL_METRIC, Comparison, Row, SweepSide, environment_same
from kvsweep.compare.judging import (
    ADDED,
    BY_NAME,
    CONTENDED,
    IMPROVEMENTS,
    REMOVED,
    SAME,
    STATUS_CHANGED,
    WITHIN_NOISE,
)
from kvsweep.grid import cell_label
from kvsweep.units import MIB

HEADER = ["cell", "new", "inputs", "metric", "A", "B", "B/A (range)", "verdict"]
QUIET = (WITHIN_NOISE, SAME)  # rows the terminal counts instead of listing


def _rank(row: Row) -> int:
    if row.regression:
        return 0
    if row.verdict == STATUS_CHANGED:
        return 1
    if row.verdict in IMPROVEMENTS:
        return 2
    order = (ADDED, REMOVED, CONTENDED, WITHIN_NOISE, SAME)
    return 3 + (order.index(row.verdict) if row.verdict in order else len(order))


def ordered(rows: list[Row]) -> list[Row]:
    """Regressions first, then other status changes, improvements, added/removed cells, the rest."""
    return sorted(rows, key=_rank)  # stable: each group keeps the cells' grid order


def number(metric: str, x: float | str | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    unit = BY_NAME[metric].unit if metric in BY_NAME else ""
    if unit == "B":
        return f"{x / MIB:.2f} MiB"
    if unit in ("ms", "tok/s"):
        return f"{x:.2f} {unit}" if x < 100 else f"{x:.0f} {unit}"
    return f"{x:.3f}"


def ratio_text(row: Row) -> str:
    if row.ratio is None:
        return "-"
    low, high = row.ratio_low, row.ratio_high
    if low is None or high is None or math.isnan(low) or (low == row.ratio == high):
        return f"{row.ratio:.3f}"
    return f"{row.ratio:.3f} ({low:.3f}-{high:.3f})"


def row_cells(row: Row) -> list[str]:
    metric = "(whole cell)" if row.metric == CELL_METRIC else row.metric
    verdict = row.verdict + (" (regression)" if row.regression and row.verdict == STATUS_CHANGED else "")
    c = row.cell
    a, b = number(row.metric, row.a), number(row.metric, row.b)
    return [cell_label(c), str(c.max_new_tokens), c.inputs, metric, a, b, ratio_text(row), verdict]


def counts(comparison: Comparison) -> str:
    tally = Counter(r.verdict for r in comparison.rows if r.metric not in (CELL_METRIC,))
    cells = Counter(r.verdict for r in comparison.rows if r.metric == CELL_METRIC)
    compared = sum(n for v, n in tally.items() if v != STATUS_CHANGED)
    parts = [f"{n} {v}" for v, n in sorted(tally.items(), key=lambda kv: -kv[1]) if v != STATUS_CHANGED]
    line = f"{comparison.matched} cells in both sweeps ({cells[ADDED]} added, {cells[REMOVED]} removed); "
    line += f"{compared} metric comparisons: {', '.join(parts) or 'none'}"
    line += f"; {tally[STATUS_CHANGED]} status changes" if tally[STATUS_CHANGED] else ""
    return line + f"; {len(comparison.regressions)} regressions."


def _side(label: str, side: SweepSide) -> str:
    return f"{label}: sweep {side.name} (parent run {side.run_id}, {len(side.results)} cells)"


def header_lines(comparison: Comparison) -> list[str]:
    """Which sweeps, what differs between them, the allowance, and what a verdict means."""
    a, b, t = comparison.a, comparison.b, comparison.thresholds
    lines = [_side("A", a), _side("B", b)]
    if comparison.environment:
        lines.append("environment differs: " + "; ".join(f"{d.what} {d.a} -> {d.b}" for d in comparison.environment))
    same = environment_same(a.results, b.results)
    lines.append("environment same: " + ("; ".join(f"{d.what} {d.a}" for d in same) or "nothing recorded"))
    if comparison.protocol:
        diffs = "; ".join(f"{d.what} {d.a} -> {d.b}" for d in comparison.protocol)
        lines.append(f"protocol differs (cells matched by grid coordinates all the same): {diffs}")
    else:
        lines.append("protocol: the same measure and inputs settings")
    if t.baseline:
        measured = ", ".join(f"{m} {t.of(m):.2f}" for m in sorted(t.by_metric))
        lines.append(
            f"thresholds: per metric, the largest change between A and its repeat {t.baseline} "
            f"({t.baseline_cells} cells; floors: timings {t.timing:.2f}, others {t.memory:.2f}): {measured}"
        )
    else:
        lines.append(
            f"thresholds: timings {t.timing:.2f} (B/A beyond {1 + t.timing:.2f} or below {1 / (1 + t.timing):.2f}), "
            f"memory peaks and quality readings {t.memory:.2f}"
        )
    lines.append(
        "verdicts: slower/faster (larger/smaller, worse/better) = the two 95% intervals do not overlap AND B/A "
        "moved beyond the threshold, the allowance for drift between two runs; within noise = either fails; "
        "contended = a timing measured under contention on either side, no verdict; KV cache bytes are exact "
        "(same or changed); a status change away from ok is a regression."
    )
    return lines


def terminal_text(comparison: Comparison, every_row: bool = False) -> str:
    """The header, the rows that say something (all with `every_row`) as an aligned table, the counts."""
    shown = [r for r in ordered(comparison.rows) if every_row or r.verdict not in QUIET]
    lines = [*header_lines(comparison), ""]
    if shown:
        table = [HEADER, *(row_cells(r) for r in shown)]
        widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in table]
    else:
        lines.append("every compared metric is within noise or the same")
    return "\n".join([*lines, "", counts(comparison)])
