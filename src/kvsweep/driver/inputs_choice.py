"""What each model of the grid is fed, decided once in the driver before Ray starts.

A prompts file with a typo or a model without a tokenizer is a config error of one line here, not a
failure in every cell after the cluster has started. Under `inputs.source=auto` nothing is an error:
a model whose tokenizer loads gets the passkey task, any other gets random ids, and the reason is
printed at the start of the run and tagged on each of its cells.
"""

from dataclasses import dataclass, field, replace

from kvsweep.config.schema import KvSweepConfig
from kvsweep.errors import ConfigError
from kvsweep.inputs.prompt_file import read_prompt_file
from kvsweep.inputs.spec import AUTO, FILE, FILE_PREFIX, PASSKEY, RANDOM, SOURCES, InputSpec
from kvsweep.model_names import display_names
from kvsweep.models.resolve import ModelRef, classify, tokenizer_problem
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
    spec = inputs_spec(cfg)
    models = list(dict.fromkeys(cfg.grid.models))
    if source == RANDOM:
        why = f"inputs.source={RANDOM}"
        return InputsChoice(spec, dict.fromkeys(models, RANDOM), {m: f"{RANDOM}: {why}" for m in models})
    if source == FILE:
        prompts = read_prompt_file(path)  # before any tokenizer: a bad file fails fast
        spec = replace(spec, file_name=prompts.name, file_sha256=prompts.sha256, records=prompts.records)
    problems = _tokenizer_problems(models, cfg.trust_remote_code)
    if source == AUTO:
        return _auto(spec, models, problems)
    _require_tokenizers(source, cfg.grid.models, problems)
    fed = f"{FILE_PREFIX}{spec.file_name}" if source == FILE else PASSKEY
    why = f"inputs.source={source}"
    summary = f"{why}, {_count(len(spec.records), 'prompt')}" if source == FILE else why
    return InputsChoice(
        spec, dict.fromkeys(models, fed), {m: f"{source}: {why}" for m in models}, dict.fromkeys(models, summary)
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
        if problem is None:
            by_model[model] = PASSKEY
            reasons[model] = f"{PASSKEY}: {AUTO}, its tokenizer loads from {_where(ref)}"
            summaries[model] = f"{AUTO}: its tokenizer loads"
        else:
            why = problem if ref.kind == "preset" else f"the tokenizer could not be loaded ({problem})"
            by_model[model] = RANDOM
            reasons[model] = f"{RANDOM}: {AUTO}, {why}"
            summaries[model] = f"{AUTO}: {why}"
    return InputsChoice(spec, by_model, reasons, summaries)


def _require_tokenizers(source: str, grid_models: list[str], problems: dict[str, tuple[ModelRef, str | None]]) -> None:
    """`passkey` and `file` feed text: every model needs a tokenizer, or the run is refused, naming each one."""
    missing = [
        f"grid.models[{index}] {model!r}: {problems[model][1]}"
        for index, model in enumerate(grid_models)
        if problems[model][1] is not None
    ]
    if missing:
        raise ConfigError(
            f"inputs.source={source} needs a tokenizer; {'; '.join(dict.fromkeys(missing))}; "
            f"use inputs.source={RANDOM} or {AUTO}"
        )


def _where(ref: ModelRef) -> str:
    return ref.reference if ref.kind == "local" else f"Hub id {ref.reference}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
