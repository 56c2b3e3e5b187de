"""Where conf/ and sweeps/ are: inside the installed package (wheel) or at the repo's top (checkout).

Compose the sweep config with Hydra (primary config + `+sweep=NAME` + overrides) and validate it.

Composition goes through Hydra's compose API rather than `@hydra.main` so every config mistake
becomes one clear line and exit code 2 before Ray starts. The run folder follows `hydra.run.dir`
(default `outputs/DATE/TIME`), with the composed config saved in it as Hydra would.
"""

import dataclasses
import difflib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvsweep.config.schema import KvSweepConfig, register_schema
from kvsweep.config.tool_variables import resolved_environment
from kvsweep.config.validate import validate
from kvsweep.errors import ConfigError, first_line
from kvsweep.redact import redact_text
from kvsweep.testing.testing_config import Seams, seams_from

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SWEEPS_PATH_ENV = "KVSWEEP_SWEEPS_PATH"


def _first_existing(name: str) -> Path:
    for candidate in (PACKAGE_DIR / name, PACKAGE_DIR.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kvsweep's {name}/ folder is missing (looked in {PACKAGE_DIR} and the repo root)")


def conf_dir() -> Path:
    return _first_existing("conf")


def sweep_dirs() -> list[Path]:
    """Bundled sweeps first, then the user's folders from KVSWEEP_SWEEPS_PATH (later ones win)."""
    extra = [Path(p).expanduser() for p in os.environ.get(SWEEPS_PATH_ENV, "").split(os.pathsep) if p]
    return [_first_existing("sweeps"), *extra]


PRIMARY = "kvsweep"
DEFAULT_SWEEP = "quickstart"
CUSTOM_SUFFIX = "-custom"  # a sweep's name once its grid was changed on the command line (`own_grid_name`)
MEASURE_GROUP = "measure"  # the config group of measure presets (conf/measure/)
SWEEP_PRESET_PREFIX = "sweep_"  # a sweep file's own `measure:` keys, as a preset (`_measure_keys_as_preset`)


def register_sweeps() -> list[str]:
    """Every `*.yaml` in the sweep folders becomes option `sweep=<stem>` (bundled first; user folders win).

    A sweep selects its measure preset in its own defaults list (`- override /measure: brief`), so a
    preset named on the command line (`measure=thorough`) replaces it: Hydra lets a command-line
    choice win over any config's `override`. Keys a sweep sets under `measure:` itself become a preset
    of their own over the one it selects (see `_measure_keys_as_preset`), so they give way the same way.
    """
    store = ConfigStore.instance()
    names = []
    for folder in sweep_dirs():
        if not folder.is_dir():
            raise ConfigError(f"sweep folder {folder} does not exist (from KVSWEEP_SWEEPS_PATH)")
        for path in sorted(folder.glob("*.yaml")):
            try:
                node = OmegaConf.load(path)
            except Exception as exc:
                raise ConfigError(f"sweep file {path} is not valid YAML: {first_line(exc)}") from None
            if isinstance(node, DictConfig) and MEASURE_GROUP in node:
                node = _measure_keys_as_preset(node, path.stem, store)
            store.store(group="sweep", name=path.stem, node=node, package="_global_")
            names.append(path.stem)
    return names


def _measure_keys_as_preset(sweep: DictConfig, stem: str, store: ConfigStore) -> DictConfig:
    """`measure:` keys in a sweep file, moved into preset `sweep_<stem>` that extends the one the sweep
    selects (else `default`); the sweep then selects that preset. Left in the sweep's body they would
    be merged after any preset, the command line's included, and `measure=NAME` would lose to them."""
    selects = f"override /{MEASURE_GROUP}"
    chosen, defaults = "default", []
    for entry in sweep.get("defaults", []):
        if isinstance(entry, DictConfig) and selects in entry:
            chosen = str(entry[selects])
        else:
            defaults.append(entry)
    preset = f"{SWEEP_PRESET_PREFIX}{stem}"
    body = OmegaConf.to_container(sweep[MEASURE_GROUP])
    store.store(group=MEASURE_GROUP, name=preset, node=OmegaConf.create({"defaults": [chosen, "_self_"], **body}))
    rest = {k: v for k, v in OmegaConf.to_container(sweep).items() if k not in ("defaults", MEASURE_GROUP)}
    return OmegaConf.create({"defaults": [*defaults, {selects: preset}], **rest})


def with_default_sweep(overrides: list[str]) -> list[str]:
    chosen = any(o.lstrip("+~").split("=", 1)[0] == "sweep" for o in overrides)
    return overrides if chosen else [f"+sweep={DEFAULT_SWEEP}", *overrides]


def check_sweep_choice(overrides: list[str], sweeps: list[str]) -> None:
    """`sweep=NAME` without the plus, and a name no sweep file has, in one line naming what was typed (Hydra's own
    errors name neither)."""
    for override in overrides:
        key, _, name = override.partition("=")
        if key.lstrip("~") != "sweep" and key != "+sweep":
            continue
        if key == "sweep":
            raise ConfigError(f"{override}: a sweep is added with a plus: +sweep={name}")
        if key == "+sweep" and name not in sweeps:
            close = difflib.get_close_matches(name, sweeps, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"+sweep={name}: unknown sweep; {hint}available: {', '.join(sorted(set(sweeps)))}")


def own_grid_name(name: str, given: list[str]) -> str | None:
    """A sweep whose grid or workload the command line changed measures something its file does not describe:
    `quickstart` given other caches is named `quickstart-custom` (the report's title, the parent run, the
    selection), unless `name=` was given too. None: the name stands."""
    if "name" in given or not any(key.split(".")[0] in ("grid", "workload") for key in given):
        return None
    return f"{name}{CUSTOM_SUFFIX}"


@dataclasses.dataclass
class Composed:
    config: KvSweepConfig  # the schema's typed objects, resolved and validated: what every stage reads
    yaml: str
    run_dir: Path
    overrides: list[str]
    hydra: dict[str, Any] = dataclasses.field(default_factory=dict)  # Hydra's own node, unresolved (--cfg hydra)
    seams: Seams = dataclasses.field(default_factory=Seams)  # test seams (`+testing.*`), never in the schema


@contextmanager
def hydra_initialized() -> Iterator[GlobalHydra]:
    """Hydra set up on kvsweep's conf/ folder (schema and sweeps registered), cleared afterwards."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="kvsweep"):
            yield GlobalHydra.instance()
    finally:
        GlobalHydra.instance().clear()


def compose_config(overrides: list[str]) -> Composed:
    register_schema()
    sweeps = register_sweeps()
    check_sweep_choice(overrides, sweeps)
    overrides = with_default_sweep(overrides)
    try:
        with hydra_initialized():
            cfg = compose(config_name=PRIMARY, overrides=overrides, return_hydra_config=True)
            run_dir = Path(str(cfg.hydra.run.dir))
            hydra_node = OmegaConf.to_container(cfg.hydra, resolve=False)
            OmegaConf.set_struct(cfg, False)
            cfg.pop("hydra")
            testing = OmegaConf.to_container(cfg.pop("testing"), resolve=True) if "testing" in cfg else None
            plain = OmegaConf.to_container(cfg, resolve=True)
            given = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
            for section, values in resolved_environment(plain, given).items():  # RAY_ADDRESS, MLFLOW_*
                plain[section].update(values)
                for key, value in values.items():
                    cfg[section][key] = value
            if (renamed := own_grid_name(plain["name"], given)) is not None:
                plain["name"] = cfg["name"] = renamed
            validate(plain, given=given)
            typed = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(describe_error(exc, sweeps)) from None
    assert isinstance(typed, KvSweepConfig)
    yaml = OmegaConf.to_yaml(OmegaConf.create(plain))
    return Composed(typed, yaml, run_dir, overrides, hydra_node, seams_from(testing))  # type: ignore[arg-type]


def describe_error(exc: BaseException, sweeps: list[str]) -> str:
    """One line from Hydra/OmegaConf's multi-line errors: what was wrong and what is allowed."""
    text = str(exc)
    ambiguous = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", text)
    if ambiguous:  # `key=1,4`: Hydra's multirun sweep syntax
        key, value = ambiguous.groups()
        return (
            f"{key}={value} is Hydra's multirun sweep syntax; kvsweep's grid takes a list instead: "
            f"'{key}=[{value}]' (one run measures every combination)"
        )
    missing = re.search(r"Could not (?:find|load) '(\w+)/([^']+)'", text)
    if missing and missing.group(1) == "sweep":
        return f"unknown sweep; available: {', '.join(sorted(set(sweeps)))}"
    if missing:  # an option of a config group, e.g. measure=NAME
        group, name = missing.groups()
        listed = re.search(rf"Available options in '{group}':\n((?:\t.*\n?)*)", text)
        named = [line.strip() for line in listed.group(1).splitlines()] if listed else ["?"]
        options = ", ".join(o for o in named if not o.startswith(SWEEP_PRESET_PREFIX))  # not a sweep file's keys
        what = "measure preset" if group == MEASURE_GROUP else f"{group} option"
        return f"{group}={name}: unknown {what}; available: {options}"
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        key = getattr(cause, "full_key", None) or ""
        message = first_line(cause)
        if "not in" in message or "is not in struct" in message:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            allowed = allowed_keys(parent)
            if allowed == "?":  # a map such as ray.resources: its keys are the user's to add
                return f"{parent} is a map; add '{key}' with a plus: '+{key}=VALUE' or '+{parent}={{...}}'"
            where = f" under {parent}" if parent else ""
            return f"unknown config key '{key}'; allowed keys{where}: {allowed}"
        if key.startswith("grid.") and "ListConfig" in message:
            return f"{key}: every grid key is a list (an axis), e.g. {key}=[...]"
        if key.startswith("workload.") and "ListConfig" in message:  # workload.serving, workload.rate
            given = getattr(cause, "value", None)
            example = "..." if given is None or isinstance(given, dict | list) else given
            return f"{key} is a list (an axis: one cell per value), e.g. '{key}=[{example}]'"
        return f"{key}: {message}" if key else message
    return first_line(exc, limit=600 if isinstance(exc, ConfigError) else 300)  # kvsweep's own lines are whole


def allowed_keys(prefix: str) -> str:
    node: Any = KvSweepConfig
    for part in [p for p in prefix.split(".") if p]:
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields or not dataclasses.is_dataclass(fields[part].default_factory):
            return "?"
        node = fields[part].default_factory
    return ", ".join(f.name for f in dataclasses.fields(node))


def save_run_config(composed: Composed) -> None:
    """Like Hydra's own `.hydra/` folder: what was asked and what it resolved to."""
    hydra_dir = composed.run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    (hydra_dir / "config.yaml").write_text(redact_text(composed.yaml))
    (hydra_dir / "overrides.yaml").write_text(redact_text(OmegaConf.to_yaml(OmegaConf.create(composed.overrides))))
