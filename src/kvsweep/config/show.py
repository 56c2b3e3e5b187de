"""What `--cfg` and `--info` print: the composed config, and where Hydra and kvsweep found it.

Both start nothing (no Ray, no MLflow) and print only what composition saw, redacted like
everything kvsweep prints.
"""

from pathlib import Path

from omegaconf import OmegaConf

from kvsweep.config.compose import (
    DEFAULT_SWEEP,
    PRIMARY,
    SWEEPS_PATH_ENV,
    compose_config,
    conf_dir,
    hydra_initialized,
    register_sweeps,
    sweep_dirs,
)
from kvsweep.config.schema import register_schema
from kvsweep.redact import redact_text


def config_yaml(overrides: list[str], part: str) -> str:
    """`--cfg job`: the composed, validated, resolved sweep config; `hydra`: Hydra's node; `all`: both."""
    composed = compose_config(overrides)
    if part == "job":
        text = composed.yaml
    elif part == "hydra":
        text = OmegaConf.to_yaml(OmegaConf.create({"hydra": composed.hydra}))
    else:
        text = OmegaConf.to_yaml(OmegaConf.create({"hydra": composed.hydra})) + composed.yaml
    return redact_text(text)


def search_path() -> list[str]:
    """Hydra's config search path as kvsweep sets it up (provider and location, in lookup order)."""
    register_schema()
    register_sweeps()
    with hydra_initialized() as hydra:
        return [f"{s.provider:<8} {s.scheme()}://{s.path}" for s in hydra.config_loader().get_sources()]


def sweep_files() -> list[tuple[Path, list[Path]]]:
    """Each sweep folder with its `*.yaml` files, bundled first (a later folder's file wins a name)."""
    return [(folder, sorted(folder.glob("*.yaml")) if folder.is_dir() else []) for folder in sweep_dirs()]


def info_text() -> str:
    lines = ["Config search path (Hydra):", *(f"  {entry}" for entry in search_path())]
    lines += [f"Primary config: {PRIMARY} ({conf_dir() / (PRIMARY + '.yaml')})", ""]
    lines.append(f"Sweep files (+sweep=NAME; default {DEFAULT_SWEEP}; add folders with {SWEEPS_PATH_ENV}):")
    winners: dict[str, Path] = {}
    for _, files in sweep_files():
        winners.update({path.stem: path for path in files})
    for index, (folder, files) in enumerate(sweep_files()):
        origin = "bundled" if index == 0 else SWEEPS_PATH_ENV
        lines.append(f"  {folder}  ({origin})")
        for path in files:
            shadowed = "" if winners[path.stem] == path else f"  (overridden by {winners[path.stem]})"
            lines.append(f"    {path.stem:<16} {path.name}{shadowed}")
    return redact_text("\n".join(lines))
