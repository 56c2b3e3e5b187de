"""Real local services for tests and the docs' screenshots: a free port, `mlflow server`, headless Chromium.

The test suite and `scripts/capacity_screenshots.py` start the same MLflow server and the same browser;
one place says how, so the flags that keep Chromium off this machine's closed network stay in step.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless, no sandbox (root), no GPU, and nothing that reaches the network on its own (a closed network
# refuses those connections, many at a time).
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--mute-audio",
)
SERVER_START_S = 120.0


def find_browser() -> str | None:
    """KVSWEEP_CHROMIUM, else the first of `chromium`, `chromium-browser`, ... on PATH."""
    configured = os.environ.get("KVSWEEP_CHROMIUM")
    if configured:
        return shutil.which(configured)
    return next((found for name in BROWSER_NAMES if (found := shutil.which(name))), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# MLflow's server runs job consumers that poll all along (about 1% of a CPU here); kvsweep submits no jobs,
# and a server beside the cells it measures must stay quiet.
QUIET_SERVER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def start_mlflow_server(
    backend_store_uri: str,
    artifacts: Path,
    port: int,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    log: IO[Any] | int = subprocess.DEVNULL,
    own_session: bool = False,
) -> subprocess.Popen:
    """A real `mlflow server` on 127.0.0.1, ready (its /health answers) when this returns; the caller stops it.

    `extra_args` (e.g. `--app-name basic-auth`) and `env` (added to this process's) configure it; `log` takes
    its output; `own_session` puts it in a process group of its own (stopped with its workers by `killpg`).
    Raises RuntimeError when it exits or does not answer within two minutes."""
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--backend-store-uri", backend_store_uri, "--artifacts-destination", str(artifacts)]
    server = subprocess.Popen(
        [*command, "--workers", "1", *extra_args],
        stdout=log,
        stderr=subprocess.STDOUT if log is not subprocess.DEVNULL else subprocess.DEVNULL,
        env={**os.environ, **QUIET_SERVER, **(env or {})},
        start_new_session=own_session,
    )
    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"mlflow server on port {port} did not start") from None
            time.sleep(0.5)
