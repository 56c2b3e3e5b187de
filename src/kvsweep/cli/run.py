"""`python -m kvsweep [overrides...]`, `... report`, `... sync`, `... compare`: exit 0 ok, 1 some cells failed
(compare: a regression), 2 bad input."""

import sys

from kvsweep.cli.hydra_flags import CommandLine, CommandLineError, parse_command_line
from kvsweep.errors import ClusterError, ConfigError

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
        from kvsweep.config.show import config_yaml

        print(config_yaml(line.overrides, line.show_config), end="")
        return 0
    if line.info:
        from kvsweep.config.show import info_text

        print(info_text())
        return 0
    return run(line.overrides)


def run(overrides: list[str]) -> int:
    from kvsweep.config.compose import compose_config, save_run_config
    from kvsweep.config.validate import check_gguf_models
    from kvsweep.driver.dry_run import dry_run
    from kvsweep.driver.inputs_choice import choose_inputs
    from kvsweep.driver.sweep import run_sweep

    composed = compose_config(overrides)
    check_gguf_models(composed.config.grid.models, composed.config.grid.weights)  # exit 2, before Ray
    inputs = choose_inputs(composed.config)  # a bad prompts file or a missing tokenizer: exit 2, nothing started
    if composed.config.dry_run:
        return dry_run(composed.config, inputs=inputs)
    save_run_config(composed)
    return run_sweep(composed.config, composed.yaml, composed.run_dir, seams=composed.seams, inputs=inputs)


def config_help() -> str:
    """Every key with its help and the value `python -m kvsweep` would use (the default sweep composed)."""
    import dataclasses

    from kvsweep.config.compose import compose_config
    from kvsweep.config.schema import KvSweepConfig

    used = dataclasses.asdict(compose_config([]).config)
    lines = ["", "Config keys (key=VALUE), with the value `python -m kvsweep` uses (its default sweep composed):"]

    def walk(node: type, values: dict, prefix: str) -> None:
        for f in dataclasses.fields(node):
            if dataclasses.is_dataclass(f.default_factory):
                walk(f.default_factory, values[f.name], f"{prefix}{f.name}.")
            else:
                key = f"{prefix}{f.name}"
                lines.append(f"  {key:<30} {f.metadata.get('help', '')} (default {values[f.name]})")

    walk(KvSweepConfig, used, "")
    return "\n".join(lines)
