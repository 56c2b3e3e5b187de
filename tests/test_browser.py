"""What a person sees: a real sweep in MLflow's web UI and its HTML report, rendered by headless Chromium.

Screenshots land in test-artifacts/ (git-ignored; CI keeps them). `KVSWEEP_UPDATE_DOCS=1` also
copies the MLflow chart view to docs/mlflow-ui.png, the README's screenshot.

How MLflow 3.17's UI is reached by URL (found in its bundle, checked here):
- `#/experiments/<id>/runs` lists the runs; a sweep's cells are collapsed under its parent run
  (the expander state is never in the URL).
- Children are nested only while runs are sorted by creation time: `?orderByKey=<any other key>`
  lists every run flat, cells included.
- The chart view with grouping and charts is a saved view: an experiment tag
  `mlflow.sharedViewState.<key>` holding `{name, createdAt, updatedAt, state: "<JSON>"}` (what the
  UI's Views menu writes), opened with `?compareRunsMode=CHART&viewStateShareKey=<key>`;
  kvsweep writes one per sweep (tracking/mlflow_ui.py) and prints its link.
"""

import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from browser import assert_not_blank, crop_right_panel, data_uri_pngs, find_browser, png_stats, render, save_compact_png
from conftest import SweepOutcome, cell_runs, sweep_in_process
from kvsweep.grid import Cell, cell_label

pytestmark = pytest.mark.skipif(
    find_browser() is None, reason="no headless browser: install Debian's `chromium` (.ci/run does)"
)

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
DOCS_SHOT = ROOT / "docs" / "mlflow-ui.png"
CACHES = ("dynamic", "static", "quantized-hqq-int4")
CONTEXTS = (32, 64)
BATCHES = (1, 2)  # a second varying axis: the chart must not average across it
EXPERIMENT = "ui"


@dataclass
class UiSweep:
    run: SweepOutcome
    base_url: str  # the real `mlflow server` the sweep logged to


@pytest.fixture(scope="module")
def ui_sweep(ray_cluster, cell_template, mlflow_server, tmp_path_factory):
    """One real tiny sweep for both tests (3 caches x 2 context lengths x 2 batch sizes, two cells at a time),
    logged over HTTP to the session's `mlflow server` in an experiment of its own."""
    axes = (
        f"grid.caches=[{','.join(CACHES)}]",
        f"grid.context_lengths=[{','.join(map(str, CONTEXTS))}]",
        f"grid.batch_sizes=[{','.join(map(str, BATCHES))}]",
        "ray.max_concurrent=2",
        "measure.warmup=1",  # steadier numbers for the screenshot, at little cost
        "measure.repeats=3",
    )
    run = sweep_in_process(tmp_path_factory.mktemp("ui-sweep") / "run", axes, mlflow_server, EXPERIMENT)
    assert run.code == 0, run.out + run.err
    return UiSweep(run, mlflow_server)


def test_mlflow_ui_shows_the_sweep_and_compares_strategies(ui_sweep):
    from mlflow import MlflowClient

    parents, children = cell_runs(ui_sweep.run.tracking_uri, EXPERIMENT)
    assert len(parents) == 1 and len(children) == len(CACHES) * len(CONTEXTS) * len(BATCHES)
    assert {c.data.tags["kvsweep.status"] for c in children} == {"ok"}
    parent_name = parents[0].info.run_name
    cell_names = sorted(c.info.run_name for c in children)
    assert "static ctx64 bs1 float32 tiny-llama" in cell_names
    for child in children:
        params = child.data.params
        cell = Cell(
            params["model"],
            params["dtype"],
            int(params["context_length"]),
            int(params["batch_size"]),
            int(params["max_new_tokens"]),
            params["cache"],
            params["compile"] == "true",
        )
        assert child.info.run_name == cell_label(cell)
    assert all(c.data.metrics["context_length"] == int(c.data.params["context_length"]) for c in children)

    base = ui_sweep.base_url
    client = MlflowClient(tracking_uri=base)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    runs = f"{base}/#/experiments/{experiment_id}/runs"

    # The link kvsweep prints: the sweep's parent run, its cells folded beneath it.
    page = render(runs, ARTIFACTS / "mlflow-runs.png")
    assert parent_name in page.text(), page.text()[-2000:]
    assert_not_blank(ARTIFACTS / "mlflow-runs.png")

    # Sorted by a metric the table is flat: every cell shows, by name.
    flat = f"{runs}?orderByKey={urllib.parse.quote('metrics.`tpot_ms`')}&orderByAsc=true"
    page = render(flat, ARTIFACTS / "mlflow-runs-flat.png")
    text = page.text()
    missing = [name for name in [parent_name, *cell_names] if name not in text]
    assert not missing, f"not rendered: {missing}\n{text[-2000:]}"

    # Comparing strategies: the saved view kvsweep wrote for this sweep, at the link it printed.
    printed = re.search(r"compare strategies: (\S+)", ui_sweep.run.out)
    assert printed, ui_sweep.run.out
    shot = ARTIFACTS / "mlflow-compare-strategies.png"
    page = render(f"{base}/#/{printed.group(1).split('/#/', 1)[1]}", shot, size=(1900, 1400))
    text = page.text()
    assert "main-svg" in page.dom, "no chart was drawn"  # plotly's svg
    assert "context_length" in text and "tpot_ms" in text
    # One line per configuration: (cache, batch size), never a mean over batch sizes.
    lines = set(re.findall(r"cache: ([\w-]+), batch_size: (\d+) \(tpot_ms\)", text))
    expected = {(cache, str(batch)) for cache in CACHES for batch in BATCHES}
    assert lines == expected, f"chart lines {sorted(lines)}\n{text[-3000:]}"
    assert not re.search(r"(?<!: )\b(dynamic|static) \(tpot_ms\)", text), "a line grouped by cache alone"
    crop_right_panel(shot)  # MLflow's assistant panel, docked right on a local server
    assert_not_blank(shot)
    if os.environ.get("KVSWEEP_UPDATE_DOCS") == "1":
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        save_compact_png(shot, DOCS_SHOT)

    # The same view as a table: each cell's contention verdict beside its numbers and their intervals.
    table = f"{base}/#/{printed.group(1).split('/#/', 1)[1].replace('compareRunsMode=CHART', 'compareRunsMode=TABLE')}"
    text = render(table, ARTIFACTS / "mlflow-compare-table.png", size=(2200, 1000)).text()
    assert "kvsweep.contended" in text and "tpot_ms_ci_low" in text, text[-2000:]


def test_html_report_renders_offline(ui_sweep):
    report = ui_sweep.run.run_dir / "report" / "report.html"
    assert report.exists(), ui_sweep.run.out
    shot = ARTIFACTS / "report.png"
    # file:// and no background networking: everything must be inline.
    page = render(report.as_uri(), shot, size=(1400, 2000), budget_ms=3000, timeout_s=60)
    dom = page.dom

    assert "<table" in dom
    tables = dom.split("<table")[1:]
    assert any(all(cache in table.split("</table>")[0] for cache in CACHES) for table in tables), (
        "no table names every cache"
    )

    images = data_uri_pngs(dom)
    assert images, "no <img> with a data:image/png URI"
    assert "<img" in dom and 'src="http' not in dom and "src='http" not in dom
    for image in images:
        assert_not_blank(image, min_colours=8, min_ink=0.005)
        stats = png_stats(image)
        assert stats.width >= 100 and stats.height >= 100, stats

    assert_not_blank(shot)
