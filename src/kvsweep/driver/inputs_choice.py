"""What each model of the grid is fed, decided once in the driver before Ray starts.

A prompts file with a typo, a model without a tokenizer, an unknown task or one that cannot fit a context the
grid asks for is a config error of one line here, not a failure in every cell after the cluster has started.
Under `inputs.source=auto` with the default suite nothing is an error: a model whose tokenizer loads gets the task
suite, any other gets random ids, and the reason is printed at the start of the run and tagged on each of its
cells; a cell too short for one of the suite's tasks runs the others.
"""

from dataclasses import dataclass, field, replace

from kvsweep.config.schema import KvSweepConfig
from kvsweep.errors import ConfigError
from kvsweep.inputs.prompt_file import read_prompt_file
from kvsweep.inputs.spec import AUTO, FILE, FILE_PREFIX, PASSKEY, RANDOM, SOURCES, TASKS, InputSpec, kind_of
from kvsweep.inputs.tasks.suite import DEFAULT_TASKS, minimum_contexts
from kvsweep.inputs.tasks.suite import TASKS as SUITE
from kvsweep.model_names import display_names
from kvsweep.models.presets import Preset, preset_for_hub
from kvsweep.models.resolve import ModelRef, classify, hub_unreachable, load_tokenizer, tokenizer_problem
from kvsweep.plan.sweep_plan import inputs_spec


@dataclass(frozen=True)
class InputsChoice:
    spec: InputSpec  # the inputs settings and, for source=file, the file's name, hash and records
    by_model: dict[str, str]  # model reference as in grid.models -> random | passkey | file:<file name>
    reasons: dict[str, str]  # model reference -> why it is fed that (the cells' inputs-reason tag)
    summaries: dict[str, str] = field(default_factory=dict)  # model reference -> the why in the run's first lines

    def lines(self) -> list[str]:
        """One line a model, in grid order: `inputs: passkey for Qwen2.5-7B (auto: its tokenizer loads)`."""
        names = display_names(self.by_model)
        return [
            f"inputs: {fed} for {names[model]} ({self.summaries.get(model) or self.reasons[model]})"
            for model, fed in self.by_model.items()
        ]


def choose_inputs(cfg: KvSweepConfig) -> InputsChoice:
    """Each model's inputs under `cfg.inputs`; a `ConfigError` (one line) for settings that cannot be met."""
    source, path = cfg.inputs.source, cfg.inputs.path
    if source not in SOURCES:
        raise ConfigError(f"inputs.source: unknown source {source!r}; allowed: {', '.join(SOURCES)}")
    if path and source != FILE:
        raise ConfigError(f"inputs.path is set ({path}) but inputs.source={source}; add inputs.source=file to use it")
    if source == FILE and not path:
        raise ConfigError("inputs.source=file needs inputs.path: a .jsonl or .txt file of prompts")
    if not cfg.inputs.depths:
        raise ConfigError("inputs.depths is empty; give at least one depth in 0-1, e.g. inputs.depths=[0.5]")
    named = _named_tasks(cfg)
    spec = inputs_spec(cfg)
    models = list(dict.fromkeys(cfg.grid.models))
    if source == RANDOM:
        why = f"inputs.source={RANDOM}"
        return InputsChoice(spec, dict.fromkeys(models, RANDOM), {m: f"{RANDOM}: {why}" for m in models})
    if source == FILE:
        prompts = read_prompt_file(path)  # before any tokenizer: a bad file fails fast
        spec = replace(spec, file_name=prompts.name, file_sha256=prompts.sha256, records=prompts.records)
    problems = _tokenizer_problems(models, cfg.trust_remote_code)
    if source == AUTO and not named:
        return _auto(spec, models, problems)
    _require_tokenizers(source, cfg.grid.models, problems)
    if source in (AUTO, TASKS):
        _require_fit(cfg, spec, problems)
    fed = {FILE: f"{FILE_PREFIX}{spec.file_name}", PASSKEY: PASSKEY}.get(source, TASKS)
    why = f"inputs.source={source}" if source != AUTO else "inputs.tasks"
    summary = f"{why}, {_count(len(spec.records), 'prompt')}" if source == FILE else why
    if fed == TASKS:
        summary = f"{why}: {', '.join(spec.tasks)}"
    summaries = {m: summary + _stand_in_words(*problems[m]) for m in models}
    return InputsChoice(spec, dict.fromkeys(models, fed), {m: f"{kind_of(fed)}: {why}" for m in models}, summaries)


def _stand_in_words(ref: ModelRef, problem: str | None) -> str:
    stand_in = _stand_in(ref, problem)
    if stand_in is None:
        return ""
    return f"; the Hub is not reachable here, so the plan reads the bundled preset {stand_in.name}'s shapes"


def _named_tasks(cfg: KvSweepConfig) -> bool:
    """Whether the user named the suite (`inputs.tasks` set, or `inputs.source=tasks`); a one-line error for an
    unknown task, an empty suite, or a suite beside a source that runs none."""
    tasks, source = list(cfg.inputs.tasks), cfg.inputs.source
    unknown = [name for name in tasks if name not in SUITE]
    if unknown:
        raise ConfigError(f"inputs.tasks: unknown task {unknown[0]!r}; known: {', '.join(SUITE)}")
    if not tasks:
        raise ConfigError(f"inputs.tasks is empty; name at least one of {', '.join(SUITE)}, or inputs.source=random")
    named = tasks != list(DEFAULT_TASKS)
    if named and source in (FILE, RANDOM, PASSKEY):
        runs = {FILE: "the file's own prompts", RANDOM: "random ids and no task", PASSKEY: "the passkey task alone"}
        raise ConfigError(
            f"inputs.tasks is set ({','.join(tasks)}) but inputs.source={source} runs {runs[source]}; "
            f"drop inputs.tasks, or use inputs.source={TASKS}"
        )
    return named or source == TASKS


def _require_fit(cfg: KvSweepConfig, spec: InputSpec, problems: dict[str, tuple[ModelRef, str | None]]) -> None:
    """Every named task fits every fixed-shape context of the grid, in each model's tokens (a Hub GGUF not yet
    fetched is checked by its cells)."""
    contexts = [] if cfg.workload.source else sorted(set(cfg.grid.context_lengths))
    if not contexts:
        return
    for index, model in enumerate(cfg.grid.models):
        ref, problem = problems[model]
        if problem is not None:
            continue
        try:
            tokenizer = load_tokenizer(ref, cfg.trust_remote_code)
        except Exception:  # a Hub GGUF whose tokenizer is read from the file once the cell has it
            continue
        least = minimum_contexts(tokenizer, spec.tasks, spec.chat_template)
        for task, tokens in least.items():
            if tokens > contexts[0]:
                raise ConfigError(
                    f"inputs.tasks: {task} needs at least {tokens} tokens with grid.models[{index}] {model!r}'s "
                    f"tokenizer, but grid.context_lengths has {contexts[0]}; drop {task} or that context"
                )


def _tokenizer_problems(models: list[str], trust_remote_code: bool) -> dict[str, tuple[ModelRef, str | None]]:
    """Each model's reference and why its tokenizer does not load (None: it loads); each place tried once."""
    tried: dict[ModelRef, str | None] = {}
    found = {}
    for model in models:
        ref = classify(model)
        if ref not in tried:
            tried[ref] = tokenizer_problem(ref, trust_remote_code)
        found[model] = (ref, tried[ref])
    return found


def _auto(spec: InputSpec, models: list[str], problems: dict[str, tuple[ModelRef, str | None]]) -> InputsChoice:
    by_model, reasons, summaries = {}, {}, {}
    for model in models:
        ref, problem = problems[model]
        stand_in = _stand_in(ref, problem)
        if stand_in is not None:  # the nodes fetch it, tokenizer and all; the plan reads the preset's shapes
            by_model[model] = TASKS
            reasons[model] = (
                f"{TASKS}: {AUTO}, Hub id {ref.reference} (not reachable from the driver; its cells fetch it)"
            )
            summaries[model] = (
                f"{AUTO}: the Hub is not reachable here, so the plan reads the bundled preset {stand_in.name}'s "
                f"shapes and the cells fetch the checkpoint and its tokenizer; {', '.join(spec.tasks)}"
            )
        elif problem is None:
            by_model[model] = TASKS
            reasons[model] = f"{TASKS}: {AUTO}, its tokenizer loads from {_where(ref)}"
            summaries[model] = f"{AUTO}: its tokenizer loads; {', '.join(spec.tasks)}"
        else:
            why = problem if ref.kind == "preset" else f"the tokenizer could not be loaded ({problem})"
            by_model[model] = RANDOM
            reasons[model] = f"{RANDOM}: {AUTO}, {why}"
            summaries[model] = f"{AUTO}: {why}"
    return InputsChoice(spec, by_model, reasons, summaries)


def _require_tokenizers(source: str, grid_models: list[str], problems: dict[str, tuple[ModelRef, str | None]]) -> None:
    """`tasks`, `passkey` and `file` feed text: every model needs a tokenizer, or the run is refused, naming each
    one (and `inputs.tasks` where auto runs a suite the user named)."""
    missing = [
        f"grid.models[{index}] {model!r}: {problems[model][1]}"
        for index, model in enumerate(grid_models)
        if problems[model][1] is not None and _stand_in(*problems[model]) is None
    ]
    if missing:
        key = "inputs.tasks" if source == AUTO else f"inputs.source={source}"
        raise ConfigError(
            f"{key} needs a tokenizer; {'; '.join(dict.fromkeys(missing))}; use inputs.source={RANDOM} or {AUTO}"
        )


def _stand_in(ref: ModelRef, problem: str | None) -> Preset | None:
    """A Hub id the driver cannot reach whose shapes a bundled preset has: planned from the preset, its tokenizer
    fetched with the checkpoint on the nodes (a tokenizer that failed for another reason is a problem)."""
    if ref.kind != "hub" or problem is None or not hub_unreachable(problem):
        return None
    return preset_for_hub(ref.reference)


def _where(ref: ModelRef) -> str:
    return ref.reference if ref.kind == "local" else f"Hub id {ref.reference}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
