"""The report's workload section: how each strategy served a replayed request mix, per request and in its tails.

A workload cell replays a mix of prompt and output lengths, so one median hides what users see: the figures give
every request's end-to-end latency and time to first token as an empirical CDF per strategy, and the tables the
percentiles with their exact 95% intervals (none where too few requests can bracket a p99: the note says so rather
than print a misleading one), throughput, goodput and what a static cache or static batching wasted on the mix.
Fixed-shape cells and cells without numbers are not drawn or tabled here; a failed cell is a line under its table.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

from kvsweep.grid import NO_WEIGHT_QUANTIZATION, strategy_label
from kvsweep.model_names import display_names, file_stem
from kvsweep.names import Metric, ci_high, ci_low
from kvsweep.report.compile_payback import payback_text
from kvsweep.report.plots import colours
from kvsweep.results import OK, CellResult
from kvsweep.units import MIB

GroupKey = tuple[str, str, str, str, str, int, float]  # model, dtype, weights, workload, serving, batch size, rate
LinkedText = str | tuple[str, str, str]  # as markdown.TableCell: plain text, or (link text, url, text after it)
REQUESTS = "requests"  # the samples key of a workload cell's per-request records, in replay order
# A request record's timings carry their metric's name: the cell writes them under the same keys
E2E, TTFT = Metric.E2E_MS, Metric.TTFT_MS
LOG_SPAN = 20.0  # a latency axis whose largest value is more than this times its smallest is logarithmic
PERCENTILES = ("p50", "p90", "p99")
TIMINGS = (
    ("TTFT", (Metric.TTFT_MS_P50, Metric.TTFT_MS_P90, Metric.TTFT_MS_P99)),
    ("TPOT", (Metric.TPOT_MS_P50, Metric.TPOT_MS_P90, Metric.TPOT_MS_P99)),
    ("e2e", (Metric.E2E_MS_P50, Metric.E2E_MS_P90, Metric.E2E_MS_P99)),
)
HEADER = [
    "strategy",
    *(f"{name} {p} ms" for name, _ in TIMINGS for p in PERCENTILES),
    "requests/s",
    "goodput req/s",
    "KV cache MiB",
    "static unused %",
    "padding %",
    "overgenerated %",
    "compile payback",
]
INTRO = (
    "Each workload replays its request mix through every strategy. The figures show, per strategy, the share of "
    "requests finished (end to end) and answered (first token) within x ms: a line further left is faster, and "
    "its top shows the tail. The tables give the percentiles over the measured requests with their exact 95% "
    "interval in brackets (distribution-free order statistics), requests per second over the replay, goodput "
    "(requests meeting every SLO set, per second; - without an SLO), the KV cache's size, the share of a static "
    "cache's reserved token slots the mix never filled, the share of prompt positions that were padding in "
    "static batches, and the share of generated tokens past the requests' own outputs (a static batch runs every "
    "row to its longest output)."
)


def group_key(result: CellResult) -> GroupKey:
    c = result.cell
    return (str(c.model), str(c.dtype), c.weights, c.workload, c.serving, int(c.batch_size), float(c.rate))


def workload_groups(results: list[CellResult]) -> dict[GroupKey, list[CellResult]]:
    """Workload cells by what they served (model, dtype, weights, mix, serving, batch, offered rate): the
    strategies that can be compared on one figure and one table. Sorted by key, then strategy; fixed-shape cells
    left out."""
    groups: dict[GroupKey, list[CellResult]] = defaultdict(list)
    for result in results:
        if result.cell.is_workload:
            groups[group_key(result)].append(result)
    return {key: sorted(groups[key], key=lambda r: strategy_label(r.cell)) for key in sorted(groups)}


@dataclass(frozen=True)
class Cdf:
    """One strategy's empirical CDF: at the i-th smallest latency (1-based), i/n of its requests were done."""

    label: str
    xs: list[float]
    ys: list[float]


def latency_cdf(result: CellResult, key: str) -> Cdf | None:
    """The CDF of one request timing (`E2E` or `TTFT`) over the cell's requests; None without any."""
    values = sorted(float(r[key]) for r in _requests(result) if r.get(key) is not None)
    if not values:
        return None
    n = len(values)
    return Cdf(strategy_label(result.cell), values, [i / n for i in range(1, n + 1)])


def _requests(result: CellResult) -> list[dict]:
    return list(result.samples.get(REQUESTS) or []) if result.status == OK else []


def group_title(key: GroupKey, model_name: str) -> str:
    _, dtype, weights, workload, serving, batch, rate = key
    quantized = "" if weights == NO_WEIGHT_QUANTIZATION else f" {weights}"
    offered = f"  at {rate:g} req/s" if rate > 0 else ""
    return f"{model_name}{quantized}  {dtype}  workload {workload}  {serving}  batch {batch}{offered}"


def group_file_name(key: GroupKey, model_name: str) -> str:
    """`workload_local-llama_float32_chat_continuous_bs4.png` (`..._bs4_2rps.png` at an offered rate): only
    letters, digits, `.`, `_` and `-`."""
    _, dtype, weights, workload, serving, batch, rate = key
    quantized = "" if weights == NO_WEIGHT_QUANTIZATION else f"_{weights}"
    offered = f"_{rate:g}rps" if rate > 0 else ""
    return file_stem(f"workload_{model_name}{quantized}_{dtype}_{workload}_{serving}_bs{batch}{offered}") + ".png"


def workload_figure(key: GroupKey, model_name: str, cells: list[CellResult], palette: dict[str, str]) -> Figure:
    """Two panels, end-to-end latency and time to first token: one CDF line per strategy that served requests."""
    figure = Figure(figsize=(14, 5.5), layout="constrained")
    axes = figure.subplots(1, 2)
    figure.suptitle(group_title(key, model_name), fontsize=13)
    for ax, timing, title in ((axes[0], E2E, "end-to-end latency"), (axes[1], TTFT, "time to first token")):
        cdfs = [cdf for r in cells if (cdf := latency_cdf(r, timing)) is not None]
        for cdf in cdfs:
            ax.plot(cdf.xs, cdf.ys, drawstyle="steps-post", color=palette.get(cdf.label), label=cdf.label)
        _latency_axis(ax, [x for cdf in cdfs for x in cdf.xs], title)
    return figure


def _latency_axis(ax: Axes, xs: list[float], title: str) -> None:
    ax.set_title(f"{title}: share of requests within x")
    ax.set_xlabel("ms")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.02)
    positive = [x for x in xs if x > 0]
    if positive and max(positive) > LOG_SPAN * min(positive):
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    if xs:
        ax.legend(fontsize=8, loc="lower right")


def draw_workloads(results: list[CellResult], out_dir: Path) -> dict[GroupKey, Path]:
    """One PNG per workload group with requests to draw, in group order; strategies coloured as in every figure."""
    groups = workload_groups(results)
    palette = colours(results)
    names = display_names(key[0] for key in groups)
    paths: dict[GroupKey, Path] = {}
    for key, cells in groups.items():
        if not any(_requests(r) for r in cells):
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        path = _unused(out_dir / group_file_name(key, names[key[0]]), paths.values())
        workload_figure(key, names[key[0]], cells, palette).savefig(path, dpi=100)
        paths[key] = path
    return paths


def _unused(path: Path, taken: Iterable[Path]) -> Path:
    """Two groups whose names differ only in characters a file name drops (`a b`, `a_b`) get `-2`, `-3`..."""
    taken, candidate, n = set(taken), path, 1
    while candidate in taken:
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


@dataclass(frozen=True)
class WorkloadTable:
    """One workload group: its title, a row per cell that ran, the cells that did not, its figure if drawn."""

    key: GroupKey
    title: str
    header: list[str]
    rows: list[list[LinkedText]]
    failed: list[str]  # "dynamic: oom": the group's cells that produced no numbers
    plot: Path | None = None


@dataclass(frozen=True)
class WorkloadSection:
    intro: str
    tables: list[WorkloadTable]
    note: str = ""  # "no interval: ...", once for the section, when some percentile had none

    @property
    def plots(self) -> list[Path]:
        return [t.plot for t in self.tables if t.plot is not None]


def workload_tables(
    results: list[CellResult], links: dict[str, str] | None = None
) -> tuple[list[WorkloadTable], list[str]]:
    """One table per workload group (a row per cell that ran), and the percentiles that lacked an interval."""
    links = links or {}
    groups = workload_groups(results)
    names = display_names(key[0] for key in groups)
    tables, bare = [], set()
    for key, cells in groups.items():
        rows = []
        for r in cells:
            if r.status != OK:
                continue
            label = strategy_label(r.cell)
            url = links.get(r.cell_id)
            timing = _timing_cells(r.metrics, bare)
            rows.append([(label, url, "") if url else label, *timing, *_other_cells(r), payback_text(r, cells)])
        failed = [f"{strategy_label(r.cell)}: {r.status}" for r in cells if r.status != OK]
        tables.append(WorkloadTable(key, group_title(key, names[key[0]]), list(HEADER), rows, failed))
    missing = [p for p in PERCENTILES if p in bare]
    return tables, missing


def _timing_cells(metrics: dict[str, float], bare: set[str]) -> list[str]:
    cells = []
    for _, names in TIMINGS:
        for percentile, name in zip(PERCENTILES, names, strict=True):
            text, has_interval = _with_interval(metrics, name)
            if not has_interval and name in metrics:
                bare.add(percentile)
            cells.append(text)
    return cells


def _with_interval(metrics: dict[str, float], name: str) -> tuple[str, bool]:
    """`12.3 [11.9–13.0]`, or the value alone when the interval is absent; `-` when the value is."""
    if metrics.get(name) is None:
        return "-", False
    low, high = metrics.get(ci_low(name)), metrics.get(ci_high(name))
    if low is None or high is None:
        return _ms(metrics[name]), False
    return f"{_ms(metrics[name])} [{_ms(low)}–{_ms(high)}]", True


def _ms(value: float) -> str:
    """One decimal; two below 1 ms, where one would round a sub-millisecond TPOT to nothing."""
    return f"{value:.2f}" if abs(value) < 1 else f"{value:.1f}"


def _other_cells(result: CellResult) -> list[str]:
    m = result.metrics
    return [
        _plain(m.get(Metric.REQUESTS_PER_S)),
        _plain(m.get(Metric.GOODPUT_REQUESTS_PER_S)),
        _plain(m.get(Metric.KV_CACHE_BYTES), MIB),
        _plain(m.get(Metric.STATIC_UNUSED_SHARE), 0.01, digits=1),
        _plain(m.get(Metric.PADDING_SHARE), 0.01, digits=1),
        _plain(m.get(Metric.OVERGENERATION_SHARE), 0.01, digits=1),
    ]


def _plain(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def no_interval_note(missing: list[str]) -> str:
    """Said once per section: which percentiles some cell had too few requests to bracket."""
    if not missing:
        return ""
    return f"no interval: too few requests for an exact 95% interval at {', '.join(missing)}"


def workload_section(
    results: list[CellResult], out_dir: Path, links: dict[str, str] | None = None
) -> WorkloadSection | None:
    """Figures (written into `out_dir`) and tables for the report; None when the sweep had no workload cell."""
    if not any(r.cell.is_workload for r in results):
        return None
    tables, missing = workload_tables(results, links)
    plots = draw_workloads(results, out_dir)
    return WorkloadSection(INTRO, [replace(t, plot=plots.get(t.key)) for t in tables], no_interval_note(missing))
