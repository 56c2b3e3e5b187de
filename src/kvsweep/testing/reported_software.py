"""Test seam: a node that says it runs other software than it does (`KVSWEEP_TESTING_REPORTED_VERSIONS`).

A cluster simulated on one machine runs the same packages on every node, so a version mismatch (or a
second GPU model) between nodes cannot happen for real there. This variable, set in one node's
environment only (`ray start` or `Cluster.add_node(env_vars=...)`), replaces what that node reports
at connect, field by field: `'{"transformers": "9.9.9", "gpu": "NVIDIA A100-SXM4-80GB"}'`. Nothing
else reads it; unset (the user's case) nothing changes.
"""

import json
import os

REPORTED_VERSIONS_ENV = "KVSWEEP_TESTING_REPORTED_VERSIONS"


def reported_overrides() -> dict[str, str]:
    """The fields this process is told to report instead of its own ({} when the variable is unset)."""
    raw = os.environ.get(REPORTED_VERSIONS_ENV, "").strip()
    if not raw:
        return {}
    try:
        given = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{REPORTED_VERSIONS_ENV} is not JSON ({exc.msg}): {raw[:200]}") from None
    if not isinstance(given, dict):
        raise ValueError(f"{REPORTED_VERSIONS_ENV} must be a JSON object of field -> value, got {raw[:200]}")
    return {str(k): str(v) for k, v in given.items()}
