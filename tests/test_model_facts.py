"""Planning reads model facts without torch or Transformers where a table or plain files allow (issue 14).

The expectations are independent of the fast path: Transformers' own config (`AutoConfig`) and a model
built on the meta device, or a real model's parameters saved with `save_pretrained`.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kvsweep.models.facts import read_facts
from kvsweep.models.presets import PRESETS
from kvsweep.models.resolve import classify, kv_shape


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_presets_facts_match_the_model_transformers_builds(name):
    preset = PRESETS[name]
    config = AutoConfig.for_model(preset.model_type, **preset.config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    facts = read_facts(classify(name))
    assert facts.shape == kv_shape(config)
    assert facts.parameters == sum(p.numel() for p in model.parameters())  # tied weights once


def _saved_model(folder: Path, tied: bool) -> int:
    """A small llama saved as safetensors; returns its parameter count (shared weights once)."""
    config = AutoConfig.for_model(
        "llama",
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def _facts_in_fresh_interpreter(folder: Path) -> dict:
    code = (
        "import json, sys; from kvsweep.models.facts import read_facts; from kvsweep.models.resolve import classify;"
        f"f = read_facts(classify({str(folder)!r}));"
        "print(json.dumps({'layers': f.shape.layers, 'kv_heads': f.shape.kv_heads, 'head_dim': f.shape.head_dim,"
        "'parameters': f.parameters, 'transformers': 'transformers' in sys.modules, 'torch': 'torch' in sys.modules}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("tied", [False, True])
def test_a_plain_local_folder_is_read_from_its_files_alone(tmp_path, tied):
    parameters = _saved_model(tmp_path, tied)
    facts = _facts_in_fresh_interpreter(tmp_path)
    assert (facts["layers"], facts["kv_heads"], facts["head_dim"]) == (3, 2, 16)
    assert facts["parameters"] == parameters
    assert not facts["transformers"] and not facts["torch"]


@pytest.mark.slow
def test_a_folder_with_custom_code_or_packed_weights_goes_through_transformers(tmp_path):
    parameters = _saved_model(tmp_path, tied=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "made-up"}  # packed weights: file shapes would mislead
    (tmp_path / "config.json").write_text(json.dumps(config))
    facts = _facts_in_fresh_interpreter(tmp_path)
    assert facts["transformers"]  # the plain reading stepped aside ...
    assert (facts["layers"], facts["kv_heads"], facts["head_dim"]) == (3, 2, 16)  # ... and the answer is the same
    assert facts["parameters"] == parameters  # built on the meta device: the same count as the saved model


def test_planning_a_preset_sweep_imports_neither_torch_transformers_nor_mlflow():
    code = (
        "import sys; from kvsweep.config.compose import compose_config; from kvsweep.driver.sweep import run_sweep;"
        "from kvsweep.driver.dry_run import dry_run; from kvsweep.plan.sweep_plan import plan_sweep;"
        "composed = compose_config(['+sweep=long_context', 'grid.models=[llama-3.1-8b]']);"
        "planned, problems = plan_sweep(composed.config, 'cuda');"
        "assert planned and not problems, problems;"
        "print(sorted(m for m in ('torch', 'transformers', 'mlflow') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
