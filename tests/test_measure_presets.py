"""What the user types last wins: a measure preset or key on the command line beats the sweep file.

Composition only (no Ray, no model): each expectation is read from the files themselves with plain
YAML (the schema's values, then the preset's keys), not from Hydra's composition.
"""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from kvsweep.cli import main
from kvsweep.config.compose import compose_config
from kvsweep.config.schema import MeasureConfig
from kvsweep.grid import RULES_OFF, MeasureProtocol, cell_id, expand_grid
from kvsweep.plan.sweep_plan import inputs_spec, protocol_of

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "measure").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml"))
SCHEMA = dataclasses.asdict(MeasureConfig())
SELECTS = "override /measure"


def preset_keys(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / "measure" / f"{name}.yaml").read_text()) or {}


def expected(preset: str) -> dict:
    return {**SCHEMA, **preset_keys(preset)}


def sweep_file(name: str) -> dict:
    return yaml.safe_load((ROOT / "sweeps" / f"{name}.yaml").read_text())


def chosen_preset(sweep: dict) -> str:
    choices = [entry[SELECTS] for entry in sweep.get("defaults", []) if isinstance(entry, dict) and SELECTS in entry]
    return choices[0] if choices else "default"


def measure_of(*overrides: str) -> dict:
    return dataclasses.asdict(compose_config(list(overrides)).config.measure)


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_on_the_command_line_beats_the_sweeps_choice(sweep, preset):
    assert measure_of(f"+sweep={sweep}", f"measure={preset}") == expected(preset)
    # ...and a key typed after it beats the preset, the rest of the preset kept
    assert measure_of(f"+sweep={sweep}", f"measure={preset}", "measure.repeats=7") == {**expected(preset), "repeats": 7}


@pytest.mark.parametrize("sweep", SWEEPS)
def test_a_sweep_selects_its_preset_and_sets_no_measure_key_itself(sweep):
    file = sweep_file(sweep)
    assert "measure" not in file  # keys in the body would be merged after any preset (see the user-sweep test)
    assert measure_of(f"+sweep={sweep}") == expected(chosen_preset(file))
    assert measure_of(f"+sweep={sweep}", "measure.warmup=4")["warmup"] == 4


def test_the_bundled_sweeps_measure_as_they_did_before_presets():
    """The warmup/repeats each sweep file stated itself (static_reserve stated none: the default preset's)."""
    before = {"quickstart": (1, 3), "gpu_smoke": (1, 3), "long_context": (2, 5), "static_reserve": (1, 5)}
    for sweep, (warmup, repeats) in before.items():
        m = measure_of(f"+sweep={sweep}")
        assert (m["warmup"], m["repeats"]) == (warmup, repeats), sweep
        assert (m["min_duration_s"], m["max_repeats"], m["max_discarded"]) == (2.0, 30, 8), sweep


# Cell ids of each bundled sweep's first cell, recorded from the code before measure presets moved into the
# sweeps' defaults lists (and before the protocol lost its defaults): resuming an older sweep finds its cells.
def test_a_cell_id_is_the_hash_of_the_version_the_cell_and_the_whole_protocol():
    """Worked out by hand from the documented recipe: sha256 of the protocol version, every field of the cell
    and every field of the protocol (the inputs by what changes the prompts), first 16 hex digits. A fixed-shape
    cell leaves out its empty workload fields and the protocol its absent workload, so its id is what it was
    before workloads existed; a cell that runs no task suite (the quickstart's preset is fed random ids) leaves
    out the suite."""
    cfg = compose_config(["+sweep=quickstart"]).config
    cell = expand_grid(dataclasses.asdict(cfg.grid))[0]
    spec = inputs_spec(cfg)
    inputs = {k: v for k, v in spec.identity().items() if k not in ("tasks", "tasks_version")}
    protocol = {"measure": dataclasses.asdict(cfg.measure), "device": "cpu", "gpus": 1, "inputs": inputs}
    fields = {k: v for k, v in dataclasses.asdict(cell).items() if k not in ("workload", "serving", "rate")}
    payload = json.dumps({"version": 3, "cell": fields, "protocol": protocol}, sort_keys=True)
    assert cell_id(cell, protocol_of(cfg.measure, "cpu", spec)) == hashlib.sha256(payload.encode()).hexdigest()[:16]


def test_every_measure_key_is_part_of_a_cells_id():
    """A measure key added to the schema reaches the cell ids with no rule of its own."""
    cfg = compose_config(["+sweep=quickstart"]).config
    cell = expand_grid(dataclasses.asdict(cfg.grid))[0]
    spec = inputs_spec(cfg)
    base = cell_id(cell, protocol_of(cfg.measure, "cpu", spec))
    for key in dataclasses.fields(MeasureConfig):
        value = getattr(cfg.measure, key.name)
        changed = dataclasses.replace(cfg.measure, **{key.name: value + 1})
        assert cell_id(cell, protocol_of(changed, "cpu", spec)) != base, key.name
    assert cell_id(cell, protocol_of(cfg.measure, "cuda", spec)) != base
    assert cell_id(cell, protocol_of(cfg.measure, "cpu", spec, gpus=2)) != base


def test_cfg_job_prints_the_preset_the_command_line_chose(capsys):
    assert main(["--cfg", "job", "+sweep=quickstart", "measure=thorough"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["measure"] == expected("thorough") and printed["name"] == "quickstart"


def test_measure_keys_in_a_users_sweep_give_way_to_the_command_line(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text("name: mine\nmeasure:\n  warmup: 4\n")
    (tmp_path / "mine_quick.yaml").write_text(f"defaults:\n  - {SELECTS}: quick\nname: mq\nmeasure:\n  warmup: 4\n")
    monkeypatch.setenv("KVSWEEP_SWEEPS_PATH", str(tmp_path))
    assert measure_of("+sweep=mine") == {**SCHEMA, "warmup": 4}  # over the default preset
    assert measure_of("+sweep=mine_quick") == {**expected("quick"), "warmup": 4}  # over the preset it selects
    assert measure_of("+sweep=mine", "measure=thorough") == expected("thorough")  # the preset typed replaces both
    assert measure_of("+sweep=mine", "measure.repeats=7") == {**SCHEMA, "warmup": 4, "repeats": 7}
    assert compose_config(["+sweep=mine_quick"]).config.name == "mq"


def test_every_default_has_one_source():
    """The schema holds every default; a preset states only what it changes; the protocol and the sampling
    rules have no defaults of their own (each is built from the one before it)."""
    assert preset_keys("default") == {}
    for preset in PRESETS:
        changed = preset_keys(preset)
        assert set(changed) <= set(SCHEMA), preset
        assert all(changed[k] != SCHEMA[k] for k in changed), f"{preset} restates a schema default"
    given = [f.name for f in dataclasses.fields(MeasureProtocol) if f.default is not dataclasses.MISSING]
    assert given == [], f"MeasureProtocol has defaults of its own: {given}"
    assert set(RULES_OFF) < {f.name for f in dataclasses.fields(MeasureConfig)}
