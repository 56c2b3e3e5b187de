"""Hydra's own command-line flags, as Hydra users type them, on kvsweep's compose-API entry point.

`@hydra.main` would parse these; kvsweep composes with Hydra's compose API (so every config mistake is
one line and exit 2), so it reads them here: `--cfg job|hydra|all` (print the composed config),
`--resolve` (kvsweep's printed config is always resolved), `--info` (search path and sweep files),
`--run`/`-r` (the default), `--help`. `-m`/`--multirun` is refused: the grid *is* the sweep.
"""

from dataclasses import dataclass, field

from kvsweep.errors import ConfigError

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
