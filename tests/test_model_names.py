"""Models given as local paths read as their folder's name everywhere a person reads them."""

import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from kvsweep.model_names import display_names, file_stem, short_name


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("/tmp/x/local-llama", "local-llama"),
        ("/tmp/x/local-llama/", "local-llama"),
        ("~/models/qwen", "qwen"),
        ("./checkpoints/step-100", "step-100"),
        ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),  # a Hub id is already short
        ("tiny-llama", "tiny-llama"),  # a preset
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B/snapshots/0123abcd", "Qwen/Qwen2.5-7B"),
    ],
)
def test_short_name(reference, expected):
    assert short_name(reference) == expected


def test_colliding_names_get_a_suffix():
    names = display_names(["/data/a/llama", "/data/b/llama", "/x/m/gpt", "/y/m/gpt", "tiny-llama"])
    assert names == {
        "/data/a/llama": "llama (a)",  # the parent folders tell them apart
        "/data/b/llama": "llama (b)",
        "/x/m/gpt": "gpt (1)",  # same parent name too: numbered, in order of the full reference
        "/y/m/gpt": "gpt (2)",
        "tiny-llama": "tiny-llama",
    }
    assert file_stem("llama (a)") == "llama_a" and file_stem("meta-llama/Llama-3.1-8B") == "meta-llama_Llama-3.1-8B"


@pytest.fixture
def two_local_llamas(tmp_path) -> list[str]:
    """Two saved random-weight llamas in folders with the same name: /…/a/local-llama and /…/b/local-llama."""
    from transformers import AutoConfig, LlamaForCausalLM

    from kvsweep.models.presets import PRESETS

    preset = PRESETS["tiny-llama"]
    config = AutoConfig.for_model(preset.model_type, **preset.config)
    folders = []
    for parent in ("a", "b"):
        folder = tmp_path / "models" / parent / "local-llama"
        LlamaForCausalLM(config).save_pretrained(folder)
        folders.append(str(folder))
    return folders


def test_sweep_shows_display_names_and_keeps_full_references(run_sweep, two_local_llamas):
    first, second = two_local_llamas
    run = run_sweep(f"grid.models=[{first},{second}]", "grid.caches=[dynamic]")
    assert run.code == 0, run.out + run.err
    models_root = str(Path(first).parent.parent)

    table = (run.run_dir / "results.txt").read_text()
    assert re.search(r"^local-llama \(a\)\s+float32\s+64\s+1\s+4\s+dynamic\s+ok", table, re.M), table
    assert re.search(r"^local-llama \(b\)\s", table, re.M) and models_root not in table
    # the selection lines (one cache a group: nothing to compare it with, and the line says so)
    assert "local-llama (a) float32 bs1 ctx64 new4: only dynamic ran here" in run.out
    progress = [line for line in run.out.splitlines() if "| ok: " in line]  # no TTY: a line per finished cell
    assert sorted(re.search(r"\| ok: (.*) tpot", line).group(1) for line in progress) == [
        "dynamic ctx64 bs1 float32 local-llama (a)",
        "dynamic ctx64 bs1 float32 local-llama (b)",
    ]

    report = run.run_dir / "report"
    plots = sorted(p.name for p in (report / "plots").glob("*.png") if p.name != "forecast_ratio.png")
    assert plots == ["local-llama_a_float32_bs1_new4.png", "local-llama_b_float32_bs1_new4.png"]
    selection = (report / "selection.md").read_text()
    decision = selection.split("## Evidence")[0]
    assert "| local-llama (a) | float32 |" in decision and models_root not in decision
    assert first in selection.split("## Evidence")[1] and second in selection  # the evidence keeps the paths

    runs = MlflowClient(run.tracking_uri).search_runs(["1"], "tags.`kvsweep.role` = 'cell'")
    assert {r.data.params["model"] for r in runs} == {first, second}  # the param keeps the full reference
    assert {r.info.run_name for r in runs} == {
        "dynamic ctx64 bs1 float32 local-llama (a)",
        "dynamic ctx64 bs1 float32 local-llama (b)",
    }
