"""MLflow names kvsweep writes and reads back, in one place, importable without MLflow.

The sweep writes with them (`client.py`) and `python -m kvsweep report` reads with them, so the two
cannot drift apart. The names are a contract (DESIGN.md): users' saved views and scripts use them.
"""

REPORT_DIR = "report"  # the run folder's report (plots, selection table, HTML), logged on the parent as is

PARENT_ID_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
SWEEP_TAG = "kvsweep.sweep"  # the sweep's name, on the parent and every cell run
SWEEP_KEY_TAG = "kvsweep.sweep_key"
ENV_TAG_PREFIX = "kvsweep.env."
CARRIED_TAGS = (
    "kvsweep.inferred",
    "kvsweep.oom_kind",
    "kvsweep.shape_only",
    "kvsweep.contended",
    "kvsweep.contention",
    "kvsweep.ci_target",
    "kvsweep.implausible",
    "kvsweep.cache_class",
    "kvsweep.low_agreement",
    "kvsweep.quality",
)
INT_PARAMS = ("context_length", "batch_size", "max_new_tokens")
PARAM_KEYS = ("model", "dtype", "context_length", "batch_size", "max_new_tokens", "cache", "compile")
