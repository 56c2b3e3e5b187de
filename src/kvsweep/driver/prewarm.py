"""Import what the driver needs later (MLflow, matplotlib) while Ray starts, instead of after it.

`ray.init` mostly waits on the processes it starts; a background thread fills that wait with the
imports of the tracking and report stages (2-3 s on a small machine). A failed import is left for
the stage that needs it to report.
"""

import contextlib
import importlib
import threading

LATER_MODULES = (
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "kvsweep.tracking.sink",
    "kvsweep.report.report_files",
)


def prewarm(modules: tuple[str, ...] = LATER_MODULES) -> threading.Thread:
    def work() -> None:
        for name in modules:
            with contextlib.suppress(Exception):  # the stage that imports it for real says what is wrong
                importlib.import_module(name)

    thread = threading.Thread(target=work, name="kvsweep-prewarm", daemon=True)
    thread.start()
    return thread
