"""Progress people can watch: a live display on a terminal, one line per finished cell in a log."""

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from conftest import FAST
from kvsweep.driver.progress import SweepProgress
from kvsweep.grid import Cell
from kvsweep.results import CellResult

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cell(cache: str, context: int = 64) -> Cell:
    return Cell("/srv/models/local-llama", "float32", context, 1, 4, cache, False)


def test_live_display_shows_running_cells_counts_and_eta():
    stream = io.StringIO()
    progress = SweepProgress(total=4, to_run=4, stream=stream, live=True)
    with progress.shown():
        progress.started("a", cell("dynamic"))
        progress.started("b", cell("static"))
        time.sleep(1.3)  # a few redraws; the running cells have run for a second
        progress.finished(CellResult("a", cell("dynamic"), "ok", metrics={"tpot_ms": 2.0}))
        progress.finished(CellResult("b", cell("static"), "error", error="boom"))
        progress.say("MLflow is not answering")
        time.sleep(0.4)
    raw = stream.getvalue()
    assert "\x1b[2K" in raw or "\x1b[1A" in raw  # redrawn in place, not appended
    text = ANSI.sub("", raw)
    assert re.search(r"running static ctx64 bs1 float32 local-llama\s+0:00:01", text), text
    assert "[0/4]" in text and "running 2 | left 2" in text and "ETA ?" in text  # before any cell finished
    assert re.search(r"\[2/4\] ok 1 error 1 \| running 0 \| left 2 \| 0:00:0\d elapsed \| ETA 0:00:0\d", text), text
    assert "| error: static ctx64 bs1 float32 local-llama boom" in text  # failures get a line above
    assert "| ok:" not in text  # a finished ok cell is in the counts, not a line of its own
    assert "MLflow is not answering" in text


def test_without_a_terminal_each_finished_cell_is_one_plain_line():
    stream = io.StringIO()
    progress = SweepProgress(total=2, to_run=2, stream=stream)  # a StringIO is no TTY
    assert not progress.live
    with progress.shown():
        progress.started("a", cell("dynamic"))
        progress.finished(CellResult("a", cell("dynamic"), "ok", metrics={"tpot_ms": 2.0}))
        progress.started("b", cell("static", 128))
        progress.finished(CellResult("b", cell("static", 128), "oom", error="CUDA out of memory"))
    lines = stream.getvalue().splitlines()
    assert not ANSI.search(stream.getvalue())
    assert len(lines) == 2
    assert lines[0].startswith("[1/2] ok 1 | running 0 | left 1")
    assert lines[0].endswith("| ok: dynamic ctx64 bs1 float32 local-llama tpot 2.00 ms")
    assert lines[1].endswith("| oom: static ctx128 bs1 float32 local-llama CUDA out of memory")


def _run_on_a_terminal(args: list[str], cwd, env) -> tuple[int, str]:
    """The command with a pseudo-terminal (120 columns) as stdin/stdout/stderr; returns (exit code, output)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, cwd=cwd, env=env)
    os.close(follower)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed with the process
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=600)
    finally:
        proc.kill()
        reader.join(timeout=10)
        os.close(leader)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_a_sweep_on_a_terminal_draws_the_live_display(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "TERM": "xterm"}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [sys.executable, "-m", "kvsweep", *FAST, "grid.caches=[dynamic,static]", "hydra.run.dir=run"]
    code, raw = _run_on_a_terminal(args, tmp_path, env)
    text = ANSI.sub("", raw)
    assert code == 0, text[-3000:]
    assert "━" in raw and "\x1b[2K" in raw  # rich's bar, redrawn in place
    assert re.search(r"running (dynamic|static) ctx64 bs1 float32 tiny-llama\s+0:00:\d\d", text), text[-3000:]
    assert re.search(r"\[2/2\] ok 2 \| running 0 \| left 0", text), text[-3000:]
    assert "| ok:" not in text  # no appended line per cell
    assert "Selection (fastest by tpot_ms" in text  # the rest of the output as usual
