"""One PNG per model/dtype/batch/new-tokens facet: the evidence behind the selection table (panels: docs/report.md).

Timings carry error bars from their 95% intervals; contended cells are drawn hollow and labelled; cells that did not
run are crosses on the axis with their status, never silently missing. Where cells answered a task or measured KL,
`<facet>_quality.png` (trained models only) shows task accuracy with its exact interval and the KL from dynamic
against context length: the evidence behind the quality gate.
"""

from collections import defaultdict
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.transforms import blended_transform_factory

from kvsweep.grid import NO_WEIGHT_QUANTIZATION, strategy_label
from kvsweep.model_names import display_names, file_stem
from kvsweep.names import Metric, ResultTag, ci_high, ci_low
from kvsweep.report.pareto import draw_pareto
from kvsweep.report.selection import memory_basis
from kvsweep.report.task_accuracy import task_accuracies
from kvsweep.results import OK, CellResult
from kvsweep.units import MIB

FacetKey = tuple[str, str, int, int, str]  # model, dtype, batch size, new tokens, weights


def facet_key(result: CellResult) -> FacetKey:
    c = result.cell
    return (str(c.model), str(c.dtype), int(c.batch_size), int(c.max_new_tokens), c.weights)


def facet_name(key: FacetKey, model_name: str) -> str:
    """The figure's file name: the model's display name, not its path (`local-llama_float32_bs1_new16`)."""
    _, dtype, batch, new, _ = key
    return f"{file_stem(model_name)}_{dtype}_bs{batch}_new{new}"


def shown_name(key: FacetKey, names: dict[str, str]) -> str:
    """The model's display name, and its weights' quantization when it has one (`local-llama quanto-int8`)."""
    weights = key[4]
    return names[key[0]] + ("" if weights == NO_WEIGHT_QUANTIZATION else f" {weights}")


def colours(results: list[CellResult]) -> dict[str, str]:
    """The same colour for a strategy in every figure."""
    palette = matplotlib.colormaps["tab10"].colors + matplotlib.colormaps["Dark2"].colors
    labels = sorted({strategy_label(r.cell) for r in results})
    return {label: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, label in enumerate(labels)}


QUALITY_SUFFIX = "_quality"


def draw_facets(
    results: list[CellResult], out_dir: Path, max_kl: float | None = None, min_strategies: int = 1
) -> list[Path]:
    """Writes one figure per facet into out_dir, and its quality figure where it has task or KL numbers;
    returns their paths in facet order. `max_kl` draws the KL limit the selection refuses above; a facet
    with fewer than `min_strategies` strategies is not drawn (a capacity search's lone probes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    facets: dict[FacetKey, list[CellResult]] = defaultdict(list)
    for result in results:
        facets[facet_key(result)].append(result)
    facets = defaultdict(
        list, {k: v for k, v in facets.items() if len({(r.cell.cache, r.cell.compile) for r in v}) >= min_strategies}
    )
    palette = colours(results)
    basis = memory_basis(results)
    names = display_names(key[0] for key in facets)
    paths = []
    for key in sorted(facets):
        shown = shown_name(key, names)
        figure = _facet_figure(key, shown, facets[key], palette, basis)
        path = out_dir / f"{facet_name(key, shown)}.png"
        figure.savefig(path, dpi=100)
        paths.append(path)
        quality = _quality_figure(key, shown, facets[key], palette, max_kl)
        if quality is not None:
            path = out_dir / f"{facet_name(key, shown)}{QUALITY_SUFFIX}.png"
            quality.savefig(path, dpi=100)
            paths.append(path)
    return paths


def _quality_figure(
    key: FacetKey, model_name: str, results: list[CellResult], palette: dict[str, str], max_kl: float | None
) -> Figure | None:
    """Task accuracy (error bars: exact 95% interval) and KL from dynamic against context; None without either,
    and None for random weights (a preset's KL says nothing about a trained model's)."""
    trained = [r for r in results if r.tags.get(ResultTag.SHAPE_ONLY) != "true"]
    accuracies = {a.metric: a for r in trained for a in task_accuracies(r.metrics)}  # every task, suite order
    metrics = [*accuracies, *([Metric.KL_DIVERGENCE] if any(_has(r, Metric.KL_DIVERGENCE) for r in trained) else [])]
    if not metrics:
        return None
    _, dtype, batch, new, _ = key
    columns = min(len(metrics), QUALITY_COLUMNS)
    rows = -(-len(metrics) // columns)
    figure = Figure(figsize=(7 * columns, 5.5 * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for spare in axes[len(metrics) :]:
        spare.set_visible(False)
    axes = axes[: len(metrics)]
    figure.suptitle(f"{model_name}  {dtype}  batch {batch}  {new} new tokens: quality against dynamic", fontsize=13)
    series = _series(results)
    contexts = sorted({int(r.cell.context_length) for r in results})
    for ax, metric in zip(axes, metrics, strict=True):
        for label, cells in series.items():
            _plot_series(ax, [r for r in cells if _has(r, metric)], metric, 1.0, palette[label])
        _mark_failures(ax, series, palette)
        if metric == Metric.KL_DIVERGENCE:
            _context_axis(ax, contexts, "mean teacher-forced KL from dynamic (nats)")
            _kl_limit(ax, max_kl)
        else:
            _context_axis(ax, contexts, f"{accuracies[metric].task} accuracy (bars: exact 95% interval)")
            ax.set_ylim(-0.03, 1.05)
        ax.legend(fontsize=8, loc="best")
    return figure


QUALITY_COLUMNS = 4  # panels a row of the quality figure (a suite's tasks and the KL)


def _kl_limit(ax: Axes, max_kl: float | None) -> None:
    """KL spans decades (0 for dynamic itself, 1e-4 for int8, over 1 for int2): linear near zero, logarithmic
    above a hundredth of the limit."""
    ax.set_yscale("symlog", linthresh=(max_kl or 0.5) / 100)
    ax.set_ylim(bottom=0)  # a divergence is never negative: no ticks below zero (symlog mirrors its decades)
    if max_kl is not None:
        ax.axhline(max_kl, color="black", linestyle="--", linewidth=1.2, label=f"report.max_kl {max_kl:g}")


def _facet_figure(
    key: FacetKey, model_name: str, results: list[CellResult], palette: dict[str, str], basis: str
) -> Figure:
    _, dtype, batch, new, _ = key
    figure = Figure(figsize=(21, 9), layout="constrained")
    axes = figure.subplots(2, 4)
    figure.suptitle(f"{model_name}  {dtype}  batch {batch}  {new} new tokens", fontsize=14)
    series = _series(results)
    contexts = sorted({int(r.cell.context_length) for r in results})
    on_gpu = basis == Metric.PEAK_DEVICE_MEM_BYTES
    peak_metric = Metric.PEAK_DEVICE_MEM_BYTES if on_gpu else Metric.PEAK_HOST_RSS_BYTES
    panels = [
        (axes[0, 0], Metric.TTFT_MS, 1.0, "time to first token (ms)"),
        (axes[0, 1], Metric.TPOT_MS, 1.0, "time per output token (ms)"),
        (axes[0, 2], Metric.DECODE_BANDWIDTH_UTILIZATION, 1.0, "decode bytes/s ÷ memory bandwidth"),
        (axes[0, 3], peak_metric, MIB, "peak GPU memory (MiB)" if on_gpu else "peak host RSS (MiB)"),
        (axes[1, 0], Metric.KV_CACHE_BYTES, MIB, "KV cache (MiB)"),
        (axes[1, 1], Metric.DECODE_TOKENS_PER_S, 1.0, "decode tokens/s"),
    ]
    for ax, metric, scale, title in panels:
        for label, cells in series.items():
            _plot_series(ax, [r for r in cells if _has(r, metric)], metric, scale, palette[label])
        _mark_failures(ax, series, palette)
        _context_axis(ax, contexts, title)
    _capacity_line(axes[0, 3], results, scale=MIB)
    _physical_limit(axes[0, 2], results)
    _dense_line(axes[1, 0], results)
    draw_pareto(axes[1, 2], results, palette, basis)
    _legend_panel(axes[1, 3], series, palette)
    return figure


def _plot_series(ax: Axes, cells: list[CellResult], metric: str, scale: float, colour: str) -> None:
    """One strategy's line; error bars where the metric has a 95% interval; contended cells hollow."""
    cells = sorted(cells, key=lambda r: int(r.cell.context_length))
    if not cells:
        return
    xs = [int(r.cell.context_length) for r in cells]
    ys = [r.metrics[metric] / scale for r in cells]
    ax.plot(xs, ys, color=colour, label=strategy_label(cells[0].cell))
    low, high = ci_low(metric), ci_high(metric)
    if all(low in r.metrics and high in r.metrics for r in cells):
        below = [y - r.metrics[low] / scale for y, r in zip(ys, cells, strict=True)]
        above = [r.metrics[high] / scale - y for y, r in zip(ys, cells, strict=True)]
        ax.errorbar(xs, ys, yerr=[below, above], fmt="none", ecolor=colour, capsize=3, linewidth=1)
    for x, y, r in zip(xs, ys, cells, strict=True):
        contended = r.tags.get(ResultTag.CONTENDED) == "true"
        ax.plot([x], [y], marker="o", color=colour, markersize=7, fillstyle="none" if contended else "full")
        if contended:
            ax.annotate("contended", (x, y), xytext=(5, -10), textcoords="offset points", fontsize=7, color=colour)


def _physical_limit(ax: Axes, results: list[CellResult]) -> None:
    """Utilization 1 is the device's copy bandwidth; points tagged implausible are ringed in red."""
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="memory bandwidth")
    for r in results:
        if _has(r, Metric.DECODE_BANDWIDTH_UTILIZATION) and r.tags.get(ResultTag.IMPLAUSIBLE) == "true":
            x, y = int(r.cell.context_length), r.metrics[Metric.DECODE_BANDWIDTH_UTILIZATION]
            ax.plot([x], [y], marker="o", markersize=14, fillstyle="none", color="red")
            ax.annotate("implausible", (x, y), xytext=(6, 6), textcoords="offset points", fontsize=8, color="red")


def _has(result: CellResult, metric: str) -> bool:
    return result.status == OK and result.metrics.get(metric) is not None


def _series(results: list[CellResult]) -> dict[str, list[CellResult]]:
    out: dict[str, list[CellResult]] = defaultdict(list)
    for result in results:
        out[strategy_label(result.cell)].append(result)
    return dict(sorted(out.items()))


def _context_axis(ax: Axes, contexts: list[int], title: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("context length (tokens)")
    if contexts and contexts[-1] >= 4 * contexts[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.grid(alpha=0.3)


def _mark_failures(ax: Axes, series: dict[str, list[CellResult]], palette: dict[str, str]) -> None:
    """A cross on the bottom edge at the cell's context, labelled with its status."""
    edge = blended_transform_factory(ax.transData, ax.transAxes)
    for label, cells in series.items():
        for result in cells:
            if result.status != OK:
                x = int(result.cell.context_length)
                ax.plot([x], [0.03], marker="x", markersize=10, mew=2.5, color=palette[label], transform=edge)
                ax.annotate(
                    result.status,
                    (x, 0.03),
                    xycoords=edge,
                    xytext=(4, 4),
                    textcoords="offset points",
                    fontsize=8,
                    color=palette[label],
                )


def _capacity_line(ax: Axes, results: list[CellResult], scale: float) -> None:
    sizes = [
        float(r.environment["device_total_mem_bytes"])
        for r in results
        if str(r.environment.get("device_total_mem_bytes", "")).replace(".", "").isdigit()
    ]
    if sizes:
        capacity = min(sizes) / scale
        ax.axhline(capacity, color="black", linestyle="--", linewidth=1.2, label="device capacity")
        ax.set_yscale("log")
        ax.annotate(
            f"capacity {capacity:,.0f} MiB",
            (0.01, capacity),
            xycoords=("axes fraction", "data"),
            xytext=(0, -12),
            textcoords="offset points",
            fontsize=8,
        )


def _dense_line(ax: Axes, results: list[CellResult]) -> None:
    dense = {
        int(r.cell.context_length): r.metrics[Metric.KV_CACHE_BYTES_DENSE] / MIB
        for r in results
        if r.metrics.get(Metric.KV_CACHE_BYTES_DENSE)
    }
    if dense:
        xs = sorted(dense)
        ax.plot(xs, [dense[x] for x in xs], color="black", linestyle="--", linewidth=1.2, label="dense (formula)")
        ax.legend(fontsize=8, loc="upper left")


def _legend_panel(ax: Axes, series: dict[str, list[CellResult]], palette: dict[str, str]) -> None:
    """Strategy colours and every cell that produced no numbers, with its status."""
    ax.axis("off")
    lines = []
    for label, cells in series.items():
        failed = [f"{r.status} at {r.cell.context_length}" for r in cells if r.status != OK]
        lines.append((label, ", ".join(failed) if failed else "all ran"))
    for i, (label, text) in enumerate(lines):
        y = 0.95 - i * 0.08
        ax.plot([0.02], [y], marker="s", markersize=10, color=palette[label], transform=ax.transAxes)
        ax.text(0.06, y, f"{label}: {text}", transform=ax.transAxes, va="center", fontsize=10)
    ax.text(
        0.02,
        0.95 - len(lines) * 0.08,
        "bars: 95% interval of the median; hollow: measured under contention",
        transform=ax.transAxes,
        va="center",
        fontsize=9,
    )
    ax.set_title("strategies (x on an axis = no result at that context)")
