"""Headless Chromium for tests: render a page once, get its DOM and a PNG screenshot.

Chromium runs as a plain subprocess (no driver, no browser download): Debian's `chromium`
package, which `.ci/run` installs. Every run gets a fresh profile, no network beyond what the page
itself loads, and a hard timeout that kills the whole process group.
"""

import base64
import io
import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsweep_testkit.local_services import HEADLESS_FLAGS, find_browser

NO_BROWSER = "no headless browser: install Debian's `chromium` package (.ci/run does) or set KVSWEEP_CHROMIUM"
FLAGS = (*HEADLESS_FLAGS, "--run-all-compositor-stages-before-draw")


@dataclass
class Rendered:
    dom: str  # the DOM after scripts ran (--dump-dom)
    screenshot: Path | None
    log: str  # the browser's stderr, for failure messages

    def text(self) -> str:
        """The DOM without tags: what a reader sees, roughly."""
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", self.dom))


def render(
    url: str,
    screenshot: Path | None = None,
    size: tuple[int, int] = (1600, 1000),
    budget_ms: int = 10000,
    timeout_s: float = 120,
) -> Rendered:
    """Load `url`, let its scripts run for `budget_ms` of virtual time, dump the DOM and screenshot it.

    Virtual time only advances while no network fetch is pending, so a single-page app's API calls
    finish inside the budget. One browser run does both the DOM and the screenshot.
    """
    browser = find_browser()
    if browser is None:
        raise RuntimeError(NO_BROWSER)
    with tempfile.TemporaryDirectory(prefix="kvsweep-chromium-") as profile:
        args = [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={budget_ms}",
        ]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.unlink(missing_ok=True)
            args.append(f"--screenshot={screenshot}")
        args += ["--dump-dom", url]
        # Its own session, so a timeout kills the renderer and GPU processes too, not just the launcher.
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            dom, log = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise TimeoutError(f"chromium did not finish {url} within {timeout_s:.0f} s") from None
    if process.returncode != 0:
        raise RuntimeError(f"chromium exited with {process.returncode} on {url}:\n{_tail(log)}")
    if screenshot is not None and not screenshot.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {url}:\n{_tail(log)}")
    return Rendered(dom, screenshot, log)


def _tail(log: str, lines: int = 20) -> str:
    keep = [line for line in log.splitlines() if "dbus" not in line]  # D-Bus noise of a headless box
    return "\n".join(keep[-lines:])


# -- PNG checks


def read_png(source: Path | bytes) -> np.ndarray:
    """RGB(A) floats in [0, 1], height x width x channels."""
    import matplotlib.image

    data = io.BytesIO(source) if isinstance(source, bytes) else source
    image = matplotlib.image.imread(data, format="png")
    return image if image.ndim == 3 else np.stack([image] * 3, axis=-1)


@dataclass
class PngStats:
    width: int
    height: int
    colours: int  # distinct RGB colours
    ink: float  # share of pixels that are not (near) white

    def __str__(self) -> str:
        return f"{self.width}x{self.height}, {self.colours} colours, {self.ink:.1%} non-white"


def png_stats(source: Path | bytes) -> PngStats:
    rgb = np.round(read_png(source)[..., :3] * 255).astype(np.uint8)
    height, width = rgb.shape[:2]
    flat = rgb.reshape(-1, 3)
    colours = len(np.unique(flat[:, 0].astype(np.uint32) << 16 | flat[:, 1].astype(np.uint32) << 8 | flat[:, 2]))
    ink = float((flat.min(axis=1) < 245).mean())
    return PngStats(width, height, colours, ink)


def assert_not_blank(source: Path | bytes, min_colours: int = 16, min_ink: float = 0.01) -> PngStats:
    """A rendered page, not an empty or single-colour canvas."""
    stats = png_stats(source)
    assert stats.colours >= min_colours and stats.ink >= min_ink, f"blank-looking PNG: {stats}"
    return stats


def data_uri_pngs(html: str) -> list[bytes]:
    """The decoded bytes of every <img src="data:image/png;base64,..."> in a page."""
    found = re.findall(r"""<img\b[^>]*\bsrc\s*=\s*["']data:image/png;base64,([A-Za-z0-9+/=\s]+)["']""", html)
    return [base64.b64decode(re.sub(r"\s+", "", payload)) for payload in found]


def crop_right_panel(path: Path) -> None:
    """Cut off a panel docked at the right edge (MLflow's assistant), in place.

    The panel sits on the page background, apart from the main card: the first column in the right
    half that is one uniform, non-white colour from top to bottom marks where the main card ends.
    Nothing found, nothing cut.
    """
    import matplotlib.image

    image = read_png(path)
    height, width = image.shape[:2]
    rows = image[height // 8 : height - height // 8 : 4, :, :3]
    uniform = np.ptp(rows, axis=0).max(axis=1) < 0.1  # the background has a slight gradient
    not_white = rows.mean(axis=0).min(axis=1) < 0.97
    candidates = [x for x in range(width // 2, width - 40) if uniform[x] and not_white[x]]
    if candidates:
        matplotlib.image.imsave(path, image[:, : candidates[0] + 4])


def save_compact_png(source: Path, target: Path) -> None:
    """A 256-colour copy (a quarter of the bytes; octree keeps the chart's colours apart)."""
    from PIL import Image

    with Image.open(source) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    palette.save(target, optimize=True)
