"""Make docs/capacity.md's two screenshots from a real capacity search, seen in headless Chromium.

    python scripts/capacity_screenshots.py [--scratch /tmp/kvsweep-capacity-shots] [--reuse]

Needs the project's venv (`pip install -e '.[quantized]'`, for the quantized-hqq-int4 cache) and a
Chromium on PATH (Debian's `chromium`; or set KVSWEEP_CHROMIUM). It runs on the CPU in a few minutes:

1. In a scratch folder (default: a new one under /tmp; never the repository) it builds a small
   random-weight Llama whose KV cache dominates its memory (16 layers of 2 KV heads x 64, a hidden size
   of 32) and runs a batch search on it: contexts 256 and 512, `dynamic` against `quantized-hqq-int4`,
   under a 0.1 GB memory limit (`measure.device_memory_limit_gb`), with `report.gpu_hour_cost=2`.
   The sweep logs to `mlflow.db` in that folder and leaves `run/` (capacity.csv, report/report.html).
   `--reuse` skips the model and the sweep when the folder already holds `run/capacity.csv`.
2. It starts `mlflow server` over that sqlite store on a free 127.0.0.1 port.
3. It drives Chromium (plain subprocess; DevTools protocol over `--remote-debugging-pipe`, so no
   driver and no websocket) with a fresh profile, no background networking and a hard timeout:
   - docs/mlflow-capacity.png: the experiment's runs table filtered to the frontier probes with the
     search box filter `tags.kvsweep.frontier = "max_batch"`, showing cache, context_length, batch_size,
     decode_tokens_per_s and kvsweep.frontier_limit (`--mlflow-mode chart`: the chart of batch_size
     against context_length, one line per cache, instead). MLflow 3.17's runs page reads the filter
     from the URL (`?searchFilter=...`, beside orderByKey, orderByAsc, ...), but the table's columns
     only from a saved view (an experiment tag `mlflow.sharedViewState.<key>`, what the UI's Views menu
     writes, opened with `?viewStateShareKey=<key>`), and with both in one URL it applies the view's
     filter but not its columns. So the script writes a view holding the filter, the sort, the
     columns and the chart into the scratch store and opens that; it checks that the search box shows
     the filter and waits for every frontier probe's name and the run count before the shot.
   - docs/report-capacity.png: the HTML report's capacity section (its table and selection lines)
     above its capacity figure (max batch against context, a line per cache), cut from the one
     rendered page by the elements' boxes and put one above the other.
   Both are saved as 256-colour PNGs.
"""

import argparse
import base64
import contextlib
import csv
import fcntl
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from kvsweep_testkit.local_services import HEADLESS_FLAGS, find_browser, free_port, start_mlflow_server

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MODEL_DIR = "tiny-kv-llama"
FILTER = 'tags.kvsweep.frontier = "max_batch"'
VIEW_KEY = "kvsweep-capacity-frontiers"
# The table's columns in order, with widths that show whole values (colId: px; the view's columnOrder/columnWidths).
COLUMNS = {
    "attributes.`Run Name`": 290,
    "runDateAndNestInfo": 150,
    "duration": 80,
    "params.`cache`": 150,
    "params.`context_length`": 130,
    "params.`batch_size`": 100,
    "metrics.`decode_tokens_per_s`": 170,
    "tags.`kvsweep.frontier_limit`": 170,
}


# -- the sweep


def build_model(folder: Path) -> None:
    """A random-weight Llama whose KV cache, not its weights, fills the memory (`kvsweep_testkit.kv_heavy`)."""
    from kvsweep_testkit.kv_heavy import save_kv_heavy

    save_kv_heavy(folder)


def sweep_command(model: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvsweep",
        "search.batch=true",
        f"grid.models=[{model}]",
        "grid.context_lengths=[256,512]",
        "grid.max_new_tokens=[8]",
        "grid.dtypes=[float32]",
        "grid.caches=[dynamic,quantized-hqq-int4]",
        "search.max_batch=32",
        "measure=quick",
        "measure.device_memory_limit_gb=0.1",
        "report.gpu_hour_cost=2",
        "hydra.run.dir=run",
    ]


def run_sweep(scratch: Path) -> None:
    model = scratch / MODEL_DIR
    build_model(model)
    command = sweep_command(model)
    print("$", " ".join(command[1:]), flush=True)
    with open(scratch / "sweep.log", "w") as log:
        code = subprocess.call(command, cwd=scratch, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"the sweep failed ({code}): {scratch / 'sweep.log'}")


def frontiers(scratch: Path) -> list[dict[str, str]]:
    """capacity.csv's rows; every (cache, context) of the search must have one."""
    with open(scratch / "run" / "capacity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    found = {(r["cache"], r["context_length"]) for r in rows if r["axis"] == "batch"}
    wanted = {(c, n) for c in ("dynamic", "quantized-hqq-int4") for n in ("256", "512")}
    if found != wanted:
        raise SystemExit(f"capacity.csv has frontiers {sorted(found)}, expected {sorted(wanted)}")
    return rows


# -- MLflow


def start_server(scratch: Path, port: int) -> subprocess.Popen:
    """`mlflow server` over the sweep's sqlite store, ready when this returns (its log beside the store)."""
    log = open(scratch / "mlflow-server.log", "w")  # noqa: SIM115 - lives as long as the server
    try:
        backend = f"sqlite:///{scratch / 'mlflow.db'}"
        return start_mlflow_server(backend, scratch / "mlartifacts", port, log=log, own_session=True)
    except RuntimeError as exc:
        raise SystemExit(f"{exc}: {scratch / 'mlflow-server.log'}") from None


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def save_frontier_view(tracking_uri: str, experiment_id: str, grouped: bool) -> None:
    """A saved view for the frontier probes: the filter, the table's columns and a chart of batch_size against
    context_length, one line per cache when `grouped` (the UI keeps columns and charts in views, never in the URL).
    Grouped, the table would fold the runs into a row per cache: only the chart groups."""
    from mlflow import MlflowClient

    section = "kvsweep-capacity"
    chart = {
        "uuid": "kvsweep-max-batch-by-context",
        "type": "LINE",
        "metricKey": "batch_size",
        "selectedMetricKeys": ["batch_size"],
        "xAxisKey": "metric",
        "selectedXAxisMetricKey": "context_length",  # a line chart's x axis must be a metric: cells log it as one
        "useGlobalXaxisKey": False,
        "displayPoints": True,
        "scaleType": "linear",
        "xAxisScaleType": "linear",
        "lineSmoothness": 0,
        "runsCountToCompare": 100,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
    }
    folded = [
        {"uuid": f"kvsweep-capacity-{name.split()[0].lower()}", "name": name, "display": False, "isGenerated": True}
        for name in ("Model metrics", "System metrics")
    ]
    state = {
        "searchFilter": FILTER,
        "orderByKey": "params.`cache`",  # any key but creation time: a flat list, not folded under the parent
        "orderByAsc": True,
        "selectedColumns": [key for key in COLUMNS if key.startswith(("params.", "metrics.", "tags."))],
        "columnOrder": list(COLUMNS),
        "columnWidths": COLUMNS,
        "groupBy": (
            {"aggregateFunction": "average", "groupByKeys": [{"mode": "param", "groupByData": "cache"}]}
            if grouped
            else None
        ),
        "useGroupedValuesInCharts": True,
        "compareRunCharts": [chart],
        "compareRunSections": [
            {"uuid": section, "name": "Capacity frontiers", "display": True, "columns": 1, "cardHeight": 420},
            *folded,
        ],
        "isAccordionReordered": True,
    }
    now = int(time.time() * 1000)
    envelope = {"name": "capacity frontiers", "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    tag = f"mlflow.sharedViewState.{VIEW_KEY}"
    MlflowClient(tracking_uri).set_experiment_tag(experiment_id, tag, json.dumps(envelope))


# -- Chromium over the DevTools protocol


def find_chromium() -> str:
    found = find_browser()
    if found is None:
        raise SystemExit("no Chromium: install Debian's `chromium` package or set KVSWEEP_CHROMIUM")
    return found


class Browser:
    """Headless Chromium driven over `--remote-debugging-pipe`: JSON messages separated by NUL on fds 3 and 4."""

    def __init__(self, size: tuple[int, int], timeout_s: float = 180):
        self.profile = tempfile.mkdtemp(prefix="kvsweep-chromium-")
        self.deadline = time.monotonic() + timeout_s
        self.size = size
        self.next_id = 0
        self.buffer = b""
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # Above 4, so the dup2s onto 3 and 4 never overwrite one another.
        spare = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w)]
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")  # noqa: SIM115
        args = [
            find_chromium(),
            *HEADLESS_FLAGS,
            f"--user-data-dir={self.profile}",
            f"--window-size={size[0]},{size[1]}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        devnull = os.open(os.devnull, os.O_RDONLY)
        self.pid = os.posix_spawn(
            args[0],
            args,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, self.log.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, self.log.fileno(), 2),
                (os.POSIX_SPAWN_DUP2, spare[0], 3),
                (os.POSIX_SPAWN_DUP2, spare[1], 4),
            ],
            setsid=True,  # its own session: closing kills the renderer and GPU processes too
        )
        for fd in (*spare, devnull):
            os.close(fd)
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page(
            "Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1, mobile=False
        )

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, self.session, **params)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium: out of time")
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed its pipe; log: {self.log.name}")
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.page("Page.navigate", url=url)

    def wait_for(self, expression: str, what: str, timeout_s: float = 60) -> Any:
        """Poll a JS expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.25)
        text = self.evaluate("document.body ? document.body.innerText : ''") or ""
        raise TimeoutError(f"waited {timeout_s:.0f} s for {what}; the page says:\n{text[-1500:]}")

    def dismiss(self, selector: str, timeout_s: float = 5) -> None:
        """Click what matches until it is gone (a panel that opens late); nothing there, nothing done."""
        deadline = time.monotonic() + timeout_s
        seen = False
        while time.monotonic() < deadline:
            present = self.evaluate(f"(e => (e && e.click(), !!e))(document.querySelector({json.dumps(selector)}))")
            seen = seen or present
            if seen and not present:
                return
            time.sleep(0.25)

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": clip is not None}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.page("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close")
        for _ in range(50):
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        for fd in (self.to_browser, self.from_browser):
            os.close(fd)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the shots


def compact_png(png: bytes, target: Path) -> None:
    """A 256-colour PNG (about a quarter of the bytes; octree keeps the charts' colours apart)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    target.parent.mkdir(parents=True, exist_ok=True)
    palette.save(target, optimize=True)
    print(f"wrote {target} ({target.stat().st_size // 1024} KiB, {palette.width}x{palette.height})", flush=True)


def frontier_run_names(base_url: str, experiment_id: str) -> list[str]:
    from mlflow import MlflowClient

    return sorted(r.info.run_name for r in MlflowClient(base_url).search_runs([experiment_id], FILTER))


def shoot_mlflow(base_url: str, rows: list[dict[str, str]], target: Path, mode: str) -> None:
    """The runs page, filtered to the frontier probes: their table (mode "table") or the frontier chart ("chart")."""
    from mlflow import MlflowClient

    experiment_id = MlflowClient(base_url).get_experiment_by_name("kvsweep").experiment_id
    save_frontier_view(base_url, experiment_id, grouped=mode == "chart")
    names = frontier_run_names(base_url, experiment_id)
    batch_frontiers = [r for r in rows if r["axis"] == "batch"]
    if len(names) != len(batch_frontiers):
        raise SystemExit(f"MLflow has {len(names)} runs tagged as frontiers, capacity.csv {len(batch_frontiers)}")
    # The filter travels in the view: with `searchFilter` in the URL too, MLflow 3.17 drops the view's columns.
    query = urllib.parse.urlencode({"compareRunsMode": mode.upper(), "viewStateShareKey": VIEW_KEY})
    url = f"{base_url}/#/experiments/{experiment_id}/runs?{query}"
    print("mlflow:", url, flush=True)
    text = "(document.body ? document.body.innerText : '')"
    with Browser((1440, 470) if mode == "table" else (1440, 900)) as browser:
        browser.goto(url)
        browser.wait_for(" && ".join(f"{text}.includes({json.dumps(n)})" for n in names), "the frontier probes' names")
        # The assistant panel and the navigation sidebar take a third of the width; the shared-view banner a row.
        browser.evaluate(
            "document.querySelector('[data-component-id=\"mlflow_header.toggle_sidebar_button\"]')?.click()"
        )
        for component in ("mlflow.assistant.chat_panel.close", "mlflow.experiment_page.shared_view.dismiss"):
            browser.dismiss(f'[data-component-id="{component}"]')
        shown = browser.wait_for(
            "document.querySelector('[data-testid=\"search-box\"]')?.value",
            "the search box",
        )
        if shown.strip() != FILTER:
            raise SystemExit(f"the search box says {shown!r}, not {FILTER!r}")
        browser.wait_for(f"{text}.includes('{len(names)} matching runs')", f"{len(names)} matching runs")
        if mode == "table":
            browser.wait_for(
                "!!document.querySelector('[role=columnheader][col-id=\"metrics.`decode_tokens_per_s`\"]')",
                "the decode_tokens_per_s column",
            )
        else:
            browser.wait_for("!!document.querySelector('.main-svg')", "the chart")
        time.sleep(1.5)  # the sidebar's and panel's closing transitions
        compact_png(browser.screenshot(), target)


def shoot_report(report: Path, target: Path) -> None:
    """The report's capacity section (heading to selection lines) above its capacity figure, from one rendering."""
    from PIL import Image

    with Browser((1000, 900)) as browser:
        browser.goto(report.as_uri())
        browser.wait_for(
            "document.readyState === 'complete' && !!document.querySelector('#capacity-lines')", "the report"
        )
        boxes = browser.evaluate(
            """(() => {
              const box = (first, last) => {
                const a = first.getBoundingClientRect(), b = last.getBoundingClientRect();
                return {x: 0, y: a.top + scrollY - 12, width: document.documentElement.clientWidth,
                        height: b.bottom - a.top + 24};
              };
              const heading = [...document.querySelectorAll('h2')].find(h => h.textContent.trim() === 'Capacity');
              const figure = [...document.querySelectorAll('img')].find(i => /_capacity$/.test(i.alt));
              if (!heading || !figure || !figure.complete) return null;
              const title = figure.previousElementSibling;
              return [box(heading, document.querySelector('#capacity-lines')),
                      box(title && title.tagName === 'H3' ? title : figure, figure)];
            })()"""
        )
        if not boxes:
            raise SystemExit(f"{report}: no Capacity heading or no capacity figure")
        parts = [Image.open(io.BytesIO(browser.screenshot(clip=box))).convert("RGB") for box in boxes]
    gap = 20
    width = max(p.width for p in parts)
    sheet = Image.new("RGB", (width, sum(p.height for p in parts) + gap * (len(parts) - 1)), "white")
    top = 0
    for i, part in enumerate(parts):
        if i:
            sheet.paste((221, 221, 221), (0, top - gap // 2, width, top - gap // 2 + 1))  # where the cut was
        sheet.paste(part, (0, top))
        top += part.height + gap
    out = io.BytesIO()
    sheet.save(out, format="PNG")
    compact_png(out.getvalue(), target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scratch", type=Path, help="folder for the model, the sweep and its MLflow store (default: new)"
    )
    parser.add_argument("--reuse", action="store_true", help="reuse the scratch folder's sweep if it has one")
    parser.add_argument(
        "--mlflow-mode", choices=("table", "chart"), default="table", help="runs table or frontier chart"
    )
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the PNGs go")
    args = parser.parse_args()
    scratch = (args.scratch or Path(tempfile.mkdtemp(prefix="kvsweep-capacity-shots-"))).resolve()
    if scratch.is_relative_to(ROOT):
        raise SystemExit(f"{scratch}: a scratch folder outside the repository, please")
    scratch.mkdir(parents=True, exist_ok=True)
    done = (scratch / "run" / "capacity.csv").exists()
    if not (args.reuse and done):
        if (scratch / "mlflow.db").exists() or (scratch / "run").exists():
            raise SystemExit(f"{scratch} holds an earlier sweep: pass --reuse or an empty folder")
        run_sweep(scratch)
    rows = frontiers(scratch)
    print(f"{len(rows)} frontiers in {scratch / 'run' / 'capacity.csv'}", flush=True)
    port = free_port()
    server = start_server(scratch, port)
    try:
        shoot_mlflow(f"http://127.0.0.1:{port}", rows, args.docs / "mlflow-capacity.png", args.mlflow_mode)
        shoot_report(scratch / "run" / "report" / "report.html", args.docs / "report-capacity.png")
    finally:
        stop(server)


if __name__ == "__main__":
    main()
