"""Which parent run is "the same sweep": its key, and the protocol version the key carries.

A resumed sweep adopts the latest parent with its key and measures only the cells that parent lacks. When a
kvsweep release changes what a cell id hashes or what a cell reports (a metric counted another way, a GPU now
metered), the cells already under an older parent were measured by other rules: resuming there would set old
numbers beside new ones under one parent. So each such change bumps `grid.PROTOCOL_VERSION`, which is part of
the key and of every cell id: the new release starts a parent of its own, measures every cell again, and says
which parent it left and why.
"""

import hashlib
import json
from dataclasses import asdict

from kvsweep.config.schema import KvSweepConfig
from kvsweep.grid import PROTOCOL_VERSION

# What each version changed in the numbers a cell reports or in what its id hashes (the run's first lines say it).
REVISION_CHANGES = {
    2: (
        "decode bytes of quantized weights counted as stored, split cells metered and capped on every GPU, "
        "bnb-nf4 computing in the cell's dtype, offloaded caches' device bytes predicted when generate returns"
    ),
    3: "cell ids hash the whole measure protocol (every measure key, wait_for_idle_gpu_s included)",
}
KEYED = ("name", "grid", "measure", "inputs", "search", "slo", "device", "trust_remote_code")


def sweep_key(cfg: KvSweepConfig, revision: int = PROTOCOL_VERSION) -> str:
    """Identity of "the same sweep" for resume: what is measured, how it is counted (`revision`) and where it is
    logged, not how it is run (Ray's keys, the planner's, the report's)."""
    if revision < 3:
        return _key_before_3(cfg, revision)
    whole = asdict(cfg)
    identity = {key: whole[key] for key in KEYED} | {"experiment": cfg.mlflow.experiment, "version": revision}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _key_before_3(cfg: KvSweepConfig, revision: int) -> str:
    """The key releases before version 3 gave a sweep, kept only to find (and name) a parent they left: their
    inputs', search's and SLO's keys, and the measure keys added later, counted only where not the default."""
    whole, defaults = asdict(cfg), asdict(KvSweepConfig())
    identity = {k: whole[k] for k in ("name", "grid", "measure", "device", "trust_remote_code")}
    identity["experiment"] = cfg.mlflow.experiment
    for key in ("search", "slo", "inputs"):
        if whole[key] != defaults[key]:
            identity[key] = whole[key]
    later = ("quality_trials", "device_memory_limit_gb")
    identity["measure"] = {k: v for k, v in whole["measure"].items() if k not in later or v != defaults["measure"][k]}
    if revision > 1:
        identity["measurement_revision"] = revision
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def earlier_revisions(cfg: KvSweepConfig) -> list[tuple[int, str]]:
    """Each earlier version with this sweep's key under it, newest first."""
    return [(r, sweep_key(cfg, r)) for r in range(PROTOCOL_VERSION - 1, 0, -1)]


def left_parent_note(revision: int, parent_run_id: str) -> str:
    """The first lines' account of an older parent this sweep does not resume."""
    changes = "; ".join(REVISION_CHANGES[r] for r in range(revision + 1, PROTOCOL_VERSION + 1))
    return (
        f"parent run {parent_run_id} holds this sweep measured by an earlier kvsweep (measurement revision "
        f"{revision}); its numbers are not mixed with this version's ({changes}): every cell is measured again "
        "under a new parent, and the old one is left as it is"
    )
