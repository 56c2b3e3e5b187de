"""`python -m kvsweep [overrides...]`, `... report`, `... sync`, `... compare`: exit 0 ok, 1 some cells failed
(compare: a regression), 2 bad input.

Hydra's own flags are read here, as Hydra users type them (kvsweep composes with Hydra's compose API, so
every config mistake is one line and exit 2): `--cfg job|hydra|all` prints the composed config (always
resolved, redacted), `--info` the search path and sweep files, `--run`/`-r` is the default, `--help`;
`-m`/`--multirun` is refused: the grid *is* the sweep. Neither `--cfg` nor `--info` starts Ray or MLflow.
"""

import sys
from dataclasses import dataclass, field
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
from kvsweep.errors import ClusterError, ConfigError
from kvsweep.redact import redact_text

CFG_PARTS = ("job", "hydra", "all")
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
MULTIRUN_REFUSAL = (
    "--multirun is not needed: the grid is the sweep. Give an axis a list "
    "('grid.batch_sizes=[1,4]', 'grid.caches=[dynamic,static]') and one run measures every combination on Ray"
)


class CommandLineError(ConfigError):
    """A flag kvsweep cannot honour (exit 2, like any bad input)."""


SUPPORTED = "Hydra overrides (key=value, +sweep=NAME), --cfg job|hydra|all, --resolve, --info, --help"


@dataclass
class CommandLine:
    overrides: list[str] = field(default_factory=list)
    show_config: str | None = None  # "job", "hydra" or "all": print it and exit
    info: bool = False
    help: bool = False


def parse_command_line(args: list[str]) -> CommandLine:
    """Flags out, overrides kept in order. A flag kvsweep cannot honour is one CommandLineError line."""
    line = CommandLine()
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        flag, has_value, value = arg.partition("=") if arg.startswith("--") else (arg, False, "")
        if flag in ("--cfg", "-c"):
            line.show_config = _cfg_part(value if has_value else (rest.pop(0) if rest else ""))
        elif flag in ("--info", "-i"):
            line.info = True
            if not has_value and rest and rest[0] in INFO_TOPICS:
                rest.pop(0)  # Hydra's topics: kvsweep prints one summary for all of them
        elif flag in ("-m", "--multirun"):
            raise CommandLineError(MULTIRUN_REFUSAL)
        elif flag in ("-h", "--help"):
            line.help = True
        elif flag in ("--resolve", "-r", "--run"):
            continue
        elif arg.startswith("-"):
            raise CommandLineError(f"unknown option '{arg}'; kvsweep takes {SUPPORTED}")
        else:
            line.overrides.append(arg)
    return line


def _cfg_part(value: str) -> str:
    if value not in CFG_PARTS:
        shown = f"'{value}'" if value else "nothing"
        raise CommandLineError(f"--cfg takes one of {', '.join(CFG_PARTS)}, not {shown} (e.g. --cfg job)")
    return value


USAGE = """usage: python -m kvsweep [+sweep=NAME] [key=value ...]   run a sweep (default: quickstart)
       python -m kvsweep dry_run=true [...]              print the grid and plan, start nothing
       python -m kvsweep --cfg job [...]                 print the composed config (job, hydra or all), start nothing
       python -m kvsweep --info                          print the config search path and the sweep files found
       python -m kvsweep report [--run-id ID] [--out DIR] rebuild a sweep's report from MLflow
       python -m kvsweep sync [PATH]                     send journaled results MLflow missed (idempotent)
       python -m kvsweep compare A B [--baseline A2]      two sweeps cell by cell; exit 1 on a regression
Overrides are Hydra's, e.g. 'grid.context_lengths=[8192,32768]' grid.caches=[dynamic,static]
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE + config_help())
        return 0
    if args and args[0] == "sync":
        from kvsweep.cli.sync import sync_main

        return sync_main(args[1:])
    if args and args[0] == "compare":
        from kvsweep.cli.compare import compare_main

        return compare_main(args[1:])
    if args and args[0] == "report":
        from kvsweep.cli.report import report_main

        return report_main(args[1:])
    try:
        return run_command_line(parse_command_line(args))
    except CommandLineError as exc:
        print(f"kvsweep: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"kvsweep: config error: {exc}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        print(f"kvsweep: cluster error: {exc}", file=sys.stderr)
        return 2


def run_command_line(line: CommandLine) -> int:
    """Hydra's flags first (each prints and exits 0, starting nothing), else the sweep."""
    if line.help:
        print(USAGE + config_help())
        return 0
    if line.show_config:
        from kvsweep.cli.run import config_yaml

        print(config_yaml(line.overrides, line.show_config), end="")
        return 0
    if line.info:
        from kvsweep.cli.run import info_text

        print(info_text())
        return 0
    return run(line.overrides)


def run(overrides: list[str]) -> int:
    from kvsweep.config.compose import compose_config, save_run_config
    from kvsweep.config.validate import check_gguf_models, check_workload
    from kvsweep.driver.dry_run import dry_run
    from kvsweep.driver.inputs_choice import choose_inputs
    from kvsweep.driver.sweep import run_sweep

    composed = compose_config(overrides)
    check_gguf_models(composed.config.grid.models, composed.config.grid.weights)  # exit 2, before Ray
    check_workload(composed.config)  # a trace's every line, a prompts file's every prompt encoded: exit 2
    inputs = choose_inputs(composed.config)  # a bad prompts file or a missing tokenizer: exit 2, nothing started
    if composed.config.dry_run:
        return dry_run(composed.config, inputs=inputs)
    save_run_config(composed)
    return run_sweep(composed.config, composed.yaml, composed.run_dir, seams=composed.seams, inputs=inputs)


def config_help() -> str:
    """Every key with its help and where its default comes from: the schema's value, and the value the sweep run
    when no `+sweep` is named uses where that sweep sets another; then what the names may be (sweeps, measure
    presets, model presets, caches)."""
    import dataclasses

    from kvsweep.caches.registry import allowed_cache_names
    from kvsweep.config.compose import DEFAULT_SWEEP, compose_config, conf_dir, register_sweeps
    from kvsweep.config.schema import KvSweepConfig
    from kvsweep.models.presets import PRESETS

    schema = dataclasses.asdict(KvSweepConfig())
    try:
        used = dataclasses.asdict(compose_config([]).config)
    except ConfigError:  # the environment holds a value the sweep would refuse (a file: store): help still helps
        used = schema
    lines = [
        "",
        "Config keys (key=VALUE) with the schema's default and, where it differs, the value `python -m kvsweep` uses "
        f"here: the {DEFAULT_SWEEP} sweep's (run when no +sweep is named; a +sweep=NAME sets its own), or Ray's and "
        "MLflow's variables resolved:",
    ]

    def walk(node: type, values: dict, defaults: dict, prefix: str) -> None:
        for f in dataclasses.fields(node):
            if dataclasses.is_dataclass(f.default_factory):
                walk(f.default_factory, values[f.name], defaults[f.name], f"{prefix}{f.name}.")
                continue
            key, value, default = f"{prefix}{f.name}", values[f.name], defaults[f.name]
            source = f"default {default!r}" if value == default else f"default {default!r}; here {value!r}"
            lines.append(f"  {key:<30} {f.metadata.get('help', '')} ({source})")

    walk(KvSweepConfig, used, schema, "")
    presets = sorted(p.stem for p in (conf_dir() / "measure").glob("*.yaml"))
    lines += [
        "",
        f"Sweeps (+sweep=NAME): {', '.join(sorted(set(register_sweeps())))}",
        f"Measure presets (measure=NAME): {', '.join(presets)}",
        f"Model presets (grid.models, random weights of a real model's shapes): {', '.join(sorted(PRESETS))}",
        f"Caches (grid.caches): {allowed_cache_names()}",
    ]
    return "\n".join(lines)


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
