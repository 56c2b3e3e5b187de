"""Which parent run is "the same sweep": its key, and the measurement revision the key carries.

A resumed sweep adopts the latest parent with its key and measures only the cells that parent lacks. When a
kvsweep release changes what a cell reports (a metric counted another way, a GPU now metered), the cells already
under an older parent were measured by other rules: resuming there would set old numbers beside new ones under
one parent. So each such change bumps `MEASUREMENT_REVISION`, which is part of the key: the new release starts a
parent of its own, measures every cell again, and says which parent it left and why.
"""

import hashlib
import json
from dataclasses import asdict

from kvsweep.config.schema import KvSweepConfig

LATER_MEASURE_KEYS = ("quality_trials", "device_memory_limit_gb")  # not in the first sweeps' keys
MEASUREMENT_REVISION = 2
# What each revision changed in the numbers a cell reports (the run's first lines say it).
REVISION_CHANGES = {
    2: (
        "decode bytes of quantized weights counted as stored, split cells metered and capped on every GPU, "
        "bnb-nf4 computing in the cell's dtype, offloaded caches' device bytes predicted when generate returns"
    ),
}


def sweep_key(cfg: KvSweepConfig, revision: int = MEASUREMENT_REVISION) -> str:
    """Identity of "the same sweep" for resume: what is measured, how it is counted (`revision`) and where it is
    logged, not how it is run.

    The inputs', search's and SLO's keys, and the measure keys added later, count only where they differ
    from the schema's defaults, so a sweep started before they existed resumes under the same key (its
    text-fed cells, if any, have new cell ids anyway). Revision 1 (before revisions existed) adds nothing."""
    whole, defaults = asdict(cfg), asdict(KvSweepConfig())
    identity = {k: whole[k] for k in ("name", "grid", "measure", "device", "trust_remote_code")}
    identity["experiment"] = cfg.mlflow.experiment
    for key in ("search", "slo"):  # only where a search is asked for: older sweeps keep their keys
        if whole[key] != defaults[key]:
            identity[key] = whole[key]
    if whole["inputs"] != defaults["inputs"]:
        identity["inputs"] = whole["inputs"]
    identity["measure"] = {  # keys added since sweeps were first keyed count only where they are set
        k: v for k, v in whole["measure"].items() if k not in LATER_MEASURE_KEYS or v != defaults["measure"][k]
    }
    if revision > 1:
        identity["measurement_revision"] = revision
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def earlier_revisions(cfg: KvSweepConfig) -> list[tuple[int, str]]:
    """Each earlier revision with this sweep's key under it, newest first."""
    return [(r, sweep_key(cfg, r)) for r in range(MEASUREMENT_REVISION - 1, 0, -1)]


def left_parent_note(revision: int, parent_run_id: str) -> str:
    """The first lines' account of an older parent this sweep does not resume."""
    changes = "; ".join(REVISION_CHANGES[r] for r in range(revision + 1, MEASUREMENT_REVISION + 1))
    return (
        f"parent run {parent_run_id} holds this sweep measured by an earlier kvsweep (measurement revision "
        f"{revision}); its numbers are not mixed with this version's ({changes}): every cell is measured again "
        "under a new parent, and the old one is left as it is"
    )
