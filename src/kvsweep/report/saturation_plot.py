"""The load-level figure of one mix: latency and what was served against the offered rate, a line per cache and
serving mode (its colour the strategy's, as in every figure; its marker the serving mode).

Three panels: time to first token and end-to-end latency (p50 solid, p90 dashed) and the served rate (goodput with
an SLO, else requests/s) with the offered rate as a dotted diagonal: a line leaving the diagonal has stopped
keeping up. A point whose cell produced no numbers is left out (the table says why).
"""

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

from kvsweep.grid import NO_WEIGHT_QUANTIZATION
from kvsweep.model_names import file_stem
from kvsweep.names import Metric
from kvsweep.report.saturation import GOODPUT, MixKey, Saturation
from kvsweep.results import OK

LOG_SPAN = 4.0  # an axis whose largest value is at least this times its smallest is logarithmic
MARKERS = {"sequential": "o", "batched": "s", "continuous": "^"}
LATENCIES = (
    ("time to first token", Metric.TTFT_MS_P50, Metric.TTFT_MS_P90),
    ("end-to-end latency", Metric.E2E_MS_P50, Metric.E2E_MS_P90),
)


def load_file_name(mix: MixKey, model_name: str) -> str:
    """`load_SmolLM2-135M_float32_chat.png`: only letters, digits, `.`, `_` and `-`."""
    _, dtype, weights, workload = mix
    quantized = "" if weights == NO_WEIGHT_QUANTIZATION else f"_{weights}"
    return file_stem(f"load_{model_name}{quantized}_{dtype}_{workload}") + ".png"


def load_figure(title: str, lines: list[Saturation], palette: dict[str, str]) -> Figure:
    figure = Figure(figsize=(16, 5), layout="constrained")
    axes = figure.subplots(1, 3)
    figure.suptitle(f"{title}: load levels", fontsize=13)
    rates = sorted({p.rate for s in lines for p in s.points})
    for ax, (name, p50, p90) in zip(axes[:2], LATENCIES, strict=True):
        for s in lines:
            style = {"color": palette.get(s.cache), "marker": MARKERS.get(s.serving, "o")}
            for metric, dash, label in ((p50, "-", s.label), (p90, "--", "_nolegend_")):  # one legend entry a line
                xs, ys = _series(s, metric)
                ax.plot(xs, ys, linestyle=dash, label=label, **style)
        _axis(ax, f"{name} (p50 solid, p90 dashed)", "ms", rates)
    _served(axes[2], lines, palette, rates)
    return figure


def _series(s: Saturation, metric: str) -> tuple[list[float], list[float]]:
    points = [
        (p.rate, p.result.metrics[metric]) for p in s.points if p.result.status == OK and metric in p.result.metrics
    ]
    return [x for x, _ in points], [y for _, y in points]


def _served(ax: Axes, lines: list[Saturation], palette: dict[str, str], rates: list[float]) -> None:
    bases = {p.basis for s in lines for p in s.points if p.basis}
    what = "goodput" if bases == {GOODPUT} else "requests/s" if GOODPUT not in bases else "goodput or requests/s"
    for s in lines:
        xs = [p.rate for p in s.points if p.served is not None]
        ys = [p.served for p in s.points if p.served is not None]
        ax.plot(xs, ys, color=palette.get(s.cache), marker=MARKERS.get(s.serving, "o"), label=s.label)
    if rates:
        ax.plot(rates, rates, linestyle=":", color="grey", label="offered")
    _axis(ax, f"served ({what}) against offered", "requests/s", rates)


def _axis(ax: Axes, title: str, unit: str, rates: list[float]) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel(unit)
    if rates and rates[-1] >= LOG_SPAN * rates[0]:
        ax.set_xscale("log")
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
    if ys and max(ys) >= LOG_SPAN * 5 * min(ys):
        ax.set_yscale("log")
    if rates:
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=7)


def draw_load_figure(title: str, lines: list[Saturation], palette: dict[str, str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    load_figure(title, lines, palette).savefig(path, dpi=100)
    return path
