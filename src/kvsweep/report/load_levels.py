"""The report's load levels: `saturation.csv`, and per mix a figure and a table added to the workload section.

Only for a sweep whose workload cells were offered rates (`workload.rate=[...]`). The tables join the workload
section's own (rendered by the same code in selection.md and report.html), after them, one per mix: a row per cache
and serving mode, how much of each rate it served, and the rate it sustains with the next one tried.
"""

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from kvsweep.model_names import display_names
from kvsweep.names import SATURATION_CSV
from kvsweep.report.plots import colours
from kvsweep.report.saturation import (
    NOT_REACHED,
    TOLERANCE,
    MixKey,
    RatePoint,
    Saturation,
    mix_title,
    saturation,
    saturation_csv,
)
from kvsweep.report.saturation_plot import draw_load_figure, load_file_name
from kvsweep.report.workload_report import WorkloadSection, WorkloadTable
from kvsweep.results import CellResult

LOAD_INTRO = (
    "Load levels: the mix offered at each workload.rate (Poisson arrivals, the same times for every cache at one "
    "rate). A cache and serving mode sustains a rate when what it served (goodput with an SLO, else requests/s) is "
    f"at least {1 - TOLERANCE:.0%} of what a server keeping up serves over the replay (the offered rate, allowing "
    "for the median request's own time after the last arrival); each rate's column gives that share. It sustains "
    "the highest rate held from the lowest up; the next rate tried failed (saturation.csv)."
)


def with_load_levels(
    workloads: WorkloadSection | None,
    results: list[CellResult],
    folder: Path,
    slo_ttft_ms: float = 0.0,
    slo_tpot_ms: float = 0.0,
) -> WorkloadSection | None:
    """`workloads` with the load-level tables (figures in `folder/plots`), `saturation.csv` written into `folder`;
    unchanged when no workload cell was offered a rate."""
    found = saturation(results)
    if workloads is None or not found:
        return workloads
    (folder / SATURATION_CSV).write_text(saturation_csv(found, slo_ttft_ms, slo_tpot_ms))
    by_mix: dict[MixKey, list[Saturation]] = defaultdict(list)
    for s in found:
        by_mix[s.mix].append(s)
    names = display_names(mix[0] for mix in by_mix)
    palette = colours(results)
    tables = []
    for mix, lines in by_mix.items():
        title = mix_title(mix, names[mix[0]])
        plot = draw_load_figure(title, lines, palette, folder / "plots" / load_file_name(mix, names[mix[0]]))
        tables.append(load_table(mix, title, lines, plot))
    return replace(workloads, intro=f"{workloads.intro} {LOAD_INTRO}", tables=[*workloads.tables, *tables])


def load_table(mix: MixKey, title: str, lines: list[Saturation], plot: Path | None = None) -> WorkloadTable:
    """A row per cache and serving mode: the share served at each rate (or its cell's status), then the rate
    sustained and the next one tried."""
    rates = sorted({p.rate for s in lines for p in s.points})
    header = ["strategy", "serving", "batch", *(f"at {r:g} req/s" for r in rates), "sustains req/s", "next req/s"]
    rows = []
    for s in lines:
        at = {p.rate: p for p in s.points}
        shares = [_share(at[r]) if r in at else "-" for r in rates]
        sustains = "-" if s.saturation_rate is None else f"{s.saturation_rate:g}"
        after = NOT_REACHED if s.next_rate is None else f"{s.next_rate:g} ({s.limit})"
        rows.append([s.cache, s.serving, str(s.batch_size), *shares, sustains, after])
    key = (*mix, "load levels", 0, 0.0)  # not a serving group's: these tables are the mix's
    return WorkloadTable(key, f"load levels: {title}", header, rows, [], plot)


def _share(point: RatePoint) -> str:
    if point.share is None:
        return point.limit
    return f"{point.share:.2f}" + ("" if point.sustained else " ✗")
