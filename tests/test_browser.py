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
  kvsweep writes one per sweep (tracking/view.py) and prints its link.
"""

import os
import re
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from browser import assert_not_blank, crop_right_panel, data_uri_pngs, find_browser, png_stats, render, save_compact_png
from conftest import FAST, SweepRun, cell_runs, free_port, start_mlflow_server, stop
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


@dataclass
class UiSweep:
    run: SweepRun
    base_url: str  # a real `mlflow server` over the sweep's store


@pytest.fixture(scope="module")
def ui_sweep(ray_cluster, tmp_path_factory):
    """One real tiny sweep for both tests (3 caches x 2 context lengths x 2 batch sizes, two cells at a time), served.

    The sweep writes straight into the file `start_mlflow_server` serves; the server starts in a
    thread while the sweep runs, once the store exists (two processes creating one store race).
    Module-scoped, so it mirrors conftest's function-scoped `run_sweep` instead of using it.
    """
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from mlflow import MlflowClient

    from kvsweep.cli import main

    tmp = tmp_path_factory.mktemp("ui-sweep")
    store = tmp / "server"
    store.mkdir()
    uri = f"sqlite:///{store / 'server.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates the store
    port = free_port()
    servers, failures = [], []

    def serve() -> None:
        try:
            servers.append(start_mlflow_server(store, port))
        except Exception as error:  # reported below, after the sweep
            failures.append(error)

    starting = threading.Thread(target=serve, daemon=True)
    starting.start()
    out, err = io.StringIO(), io.StringIO()
    args = [
        *FAST,
        f"grid.caches=[{','.join(CACHES)}]",
        f"grid.context_lengths=[{','.join(map(str, CONTEXTS))}]",
        f"grid.batch_sizes=[{','.join(map(str, BATCHES))}]",
        "ray.max_concurrent=2",
        "measure.warmup=1",  # steadier numbers for the screenshot, at little cost
        "measure.repeats=3",
        f"mlflow.tracking_uri={uri}",
        "mlflow.experiment=kvsweep",
        f"hydra.run.dir={tmp / 'run'}",
    ]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(args)
        run = SweepRun(code, out.getvalue(), err.getvalue(), uri, tmp / "run")
        assert run.code == 0, run.out + run.err
        starting.join(timeout=180)
        assert servers, f"mlflow server did not start: {failures}"
        yield UiSweep(run, f"http://127.0.0.1:{port}")
    finally:
        starting.join(timeout=180)
        for server in servers:
            stop(server)


def test_mlflow_ui_shows_the_sweep_and_compares_strategies(ui_sweep):
    from mlflow import MlflowClient

    parents, children = cell_runs(ui_sweep.run.tracking_uri)
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
    experiment_id = client.get_experiment_by_name("kvsweep").experiment_id
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
