"""What the driver's environment says about the Hugging Face Hub, read once and sent to every node's fetch.

The driver's environment decides: `HF_HUB_OFFLINE` (fetch nothing; what is cached is used),
`HF_HOME` / `HF_HUB_CACHE` (the cache every node fetches into and the cells read; unset: each node's
own) and `HF_TOKEN` (sent to the fetch tasks only; unset: each node's own token, if any).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass

_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubSettings:
    """What the driver's environment says about the Hub, for every node's fetch."""

    offline: bool  # HF_HUB_OFFLINE: fetch nothing, use what the cache holds
    token: str | None  # HF_TOKEN: None, each node's own token (its HF_TOKEN or HF_HOME/token)
    cache_dir: str | None  # HF_HUB_CACHE, else HF_HOME/hub; None: each node's own cache


def hub_settings(environ: Mapping[str, str] | None = None) -> HubSettings:
    """The settings from the driver's environment (os.environ unless given), read when the sweep runs."""
    env = os.environ if environ is None else environ
    offline = any(env.get(key, "").strip().lower() in _TRUE for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    cache_dir = env.get("HF_HUB_CACHE") or (os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None)
    expanded = os.path.expanduser(os.path.expandvars(cache_dir)) if cache_dir else None
    return HubSettings(offline, env.get("HF_TOKEN") or None, expanded)
