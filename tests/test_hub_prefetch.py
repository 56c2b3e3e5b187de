"""Hub models fetched once per node before any cell: which files, the skips, offline, tokens, the order.

Nothing reaches the Hub: the Hub is the test seam `kvsweep.testing.fake_hub.FolderHub` (`+testing.hub=FOLDER`),
serving tiny random-weight models saved with `save_pretrained` into a real Hub cache, from which the
cells' Transformers really loads them, offline (the suite keeps `HF_HUB_OFFLINE=1`).
"""

import json
import shutil
from pathlib import Path

import pytest

from kvsweep.driver.hub_node_fetch import HubSettings, fetch_on_node, files_to_fetch, hub_settings, load_problem
from kvsweep.driver.hub_prefetch import ModelFetch, models_to_fetch, plan_after, skip_unavailable
from kvsweep.errors import ConfigError
from kvsweep.grid import Cell, MeasureProtocol
from kvsweep.models.facts import read_facts
from kvsweep.models.resolve import ModelRef, cached_snapshot
from kvsweep.plan.cell_plan import PlannedCell, plan_cell
from kvsweep.redact import MASK, redact_text
from kvsweep.testing.fake_hub import FETCH_LOG, FolderHub
from kvsweep.testing.testing_config import seams_from
from kvsweep_testkit.cells import measure_cell
from kvsweep_testkit.kv_heavy import save_kv_heavy

TINY = "kvsweep-test/tiny"
JUNK = ("README.md", ".gitattributes", "pytorch_model.bin", "onnx/model.onnx", "original/consolidated.pth")
# The token the user set (not the one the gated repo accepts): it must never show anywhere.
USER_TOKEN = "hf_" + "Q7wz" * 8 + "xy"
ACCEPTED_TOKEN = "hf_" + "Acc3pt" * 6
# Per token, kv_heavy's dynamic cache holds 16 layers x K and V x 2 heads x 64 dims x 4 bytes (float32).
KV_HEAVY_BYTES_PER_TOKEN = 16 * 2 * 2 * 64 * 4

# mistralai/Mistral-7B-v0.3's files as its Hub page lists them: the sharded weights Transformers reads, and
# the same weights again in mistral-inference's format (consolidated.safetensors, params.json).
MISTRAL_FILES = [
    ".gitattributes",
    "README.md",
    "config.json",
    "consolidated.safetensors",
    "generation_config.json",
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
    "model.safetensors.index.json",
    "params.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer.model.v3",
    "tokenizer_config.json",
]
# openai-community/gpt2's: one checkpoint in six formats, plus ONNX exports in a sub-folder.
GPT2_FILES = [
    ".gitattributes",
    "64-8bits.tflite",
    "64-fp16.tflite",
    "64.tflite",
    "README.md",
    "config.json",
    "flax_model.msgpack",
    "generation_config.json",
    "merges.txt",
    "model.safetensors",
    "onnx/config.json",
    "onnx/decoder_model.onnx",
    "onnx/tokenizer.json",
    "pytorch_model.bin",
    "rust_model.ot",
    "tf_model.h5",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
]


def test_a_sharded_repo_gets_its_config_tokenizer_index_and_the_shards_the_index_names():
    first = files_to_fetch(MISTRAL_FILES)
    assert sorted(first) == [
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",  # read before the shards: it names them
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
    ]
    index = {"weight_map": {f"layers.{i}": f"model-0000{i % 3 + 1}-of-00003.safetensors" for i in range(32)}}
    assert sorted(set(files_to_fetch(MISTRAL_FILES, index)) - set(first)) == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]  # never consolidated.safetensors (14.5 GB of the same weights), params.json or tokenizer.model.v3


def test_a_repo_in_many_formats_gets_safetensors_only_and_nothing_from_sub_folders():
    assert sorted(files_to_fetch(GPT2_FILES)) == [
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]


def test_pytorch_bin_weights_are_fetched_only_where_there_are_no_safetensors():
    files = [
        "config.json",
        "pytorch_model.bin.index.json",
        "tf_model.h5",
        *(f"pytorch_model-0000{i}-of-00002.bin" for i in (1, 2)),
    ]
    index = {"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}
    assert sorted(files_to_fetch(files, index)) == sorted(set(files) - {"tf_model.h5"})


def test_a_repos_own_code_is_fetched_only_with_trust_remote_code():
    files = ["config.json", "model.safetensors", "configuration_tiny.py", "modeling_tiny.py", "scripts/convert.py"]
    assert sorted(files_to_fetch(files)) == ["config.json", "model.safetensors"]
    assert sorted(files_to_fetch(files, with_code=True)) == [
        "config.json",
        "configuration_tiny.py",
        "model.safetensors",
        "modeling_tiny.py",
    ]


def test_a_repo_a_load_cannot_read_says_why():
    assert "no config.json" in load_problem(["model.safetensors", "tokenizer.json"])
    assert "no model.safetensors or pytorch_model.bin" in load_problem(["config.json", "model-q4_k_m.gguf"])
    assert load_problem(GPT2_FILES) is None


def test_the_drivers_environment_decides_offline_token_and_cache():
    assert hub_settings({}) == HubSettings(offline=False, token=None, cache_dir=None)
    settings = hub_settings({"HF_HUB_OFFLINE": "1", "HF_HOME": "/data/hf", "HF_TOKEN": USER_TOKEN})
    assert settings == HubSettings(offline=True, token=USER_TOKEN, cache_dir="/data/hf/hub")
    assert hub_settings({"HF_HOME": "/data/hf", "HF_HUB_CACHE": "/fast/hub"}).cache_dir == "/fast/hub"
    assert hub_settings({"TRANSFORMERS_OFFLINE": "true"}).offline and not hub_settings({"HF_HUB_OFFLINE": "0"}).offline


def test_a_hugging_face_token_is_masked_even_where_no_variable_holds_it():
    said = f"401 for 'Authorization: Bearer {USER_TOKEN}'; metric hf_fetch_s_total; hf_short"
    assert redact_text(said, environ={}) == f"401 for 'Authorization: Bearer {MASK}'; metric hf_fetch_s_total; hf_short"


def test_the_hub_seam_must_be_a_folder(tmp_path):
    assert seams_from({"hub": str(tmp_path)}).hub == str(tmp_path)
    with pytest.raises(ConfigError, match=r"testing\.hub: .* is not a folder"):
        seams_from({"hub": str(tmp_path / "none")})


def test_only_the_cells_of_a_model_that_cannot_be_fetched_are_skipped():
    def planned(model: str, cache: str, reason: str | None = None) -> PlannedCell:
        return PlannedCell(Cell(model, "float32", 64, 1, 4, cache, False), reason)

    plan = [
        planned("org/gated", "dynamic"),
        planned("org/gated", "offloaded", "offloaded needs CUDA"),
        planned(TINY, "dynamic"),
    ]
    fetches = {"org/gated": ModelFetch("org/gated is gated"), TINY: ModelFetch(None)}
    after = skip_unavailable(plan, fetches)
    assert [p.skip_reason for p in after] == ["org/gated is gated", "offloaded needs CUDA", None]


def test_hub_models_of_cells_to_run_are_fetched_and_a_mistyped_preset_stays_an_error(tmp_path):
    def planned(model: str, reason: str | None = None) -> PlannedCell:
        return PlannedCell(Cell(model, "float32", 64, 1, 4, "dynamic", False), reason)

    plan = [
        planned("tiny-llama"),  # a bundled preset
        planned(str(tmp_path)),  # a local folder
        planned("Qwen/Qwen2.5-7B-Instruct"),
        planned("Qwen/Qwen2.5-7B-Instruct"),
        planned("gpt2"),  # an old bare Hub id the planner read
        planned("org/all-skipped", "offloaded needs CUDA"),
        planned("org/unread"),  # gated, or offline: the planner could not read it on the driver
        planned("tiny-lama"),  # a typo: neither a preset, a folder nor on the Hub
    ]
    problems = {"org/unread": "could not be resolved", "tiny-lama": "could not be resolved"}
    assert models_to_fetch(plan, problems) == ["Qwen/Qwen2.5-7B-Instruct", "gpt2", "org/unread"]


def test_a_model_the_driver_could_not_read_is_planned_from_its_fetched_files(tmp_path):
    facts = read_facts(ModelRef(str(save_kv_heavy(tmp_path / "tiny")), "local"))  # what a node reads after fetching
    models = (TINY, "org/gated", "tiny-lama")
    pending = [PlannedCell(Cell(m, "float32", 64, 1, 4, "dynamic", False), None) for m in models]
    problems = {m: f"model {m!r} could not be resolved" for m in models}  # the driver read none of them
    fetches = {TINY: ModelFetch(None, facts=facts), "org/gated": ModelFetch("org/gated is gated")}

    def replan(cell: Cell, facts) -> PlannedCell:
        return plan_cell(cell, "cpu", facts.shape, parameters=facts.parameters)

    after, kept = plan_after(pending, problems, fetches, replan)
    by_model = {p.cell.model: p for p in after}
    assert by_model[TINY].runs and by_model[TINY].kv_dense_bytes == KV_HEAVY_BYTES_PER_TOKEN * (64 + 4 - 1)
    assert by_model["org/gated"].skip_reason == "org/gated is gated"
    assert kept == {"tiny-lama": problems["tiny-lama"]}  # never fetched: still the plan's error
    _, kept_by_a_search = plan_after(pending, problems, fetches, None)  # a search cannot plan again
    assert sorted(kept_by_a_search) == [TINY, "tiny-lama"]


def save_repo(hub: Path, repo: str, shard_kb: int = 0) -> Path:
    """A tiny random-weight model as a Hub repo folder, with the files a real repo holds beside it."""
    folder = hub / repo
    if shard_kb:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from kvsweep_testkit.kv_heavy import KV_HEAVY_CONFIG

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**KV_HEAVY_CONFIG)).save_pretrained(folder, max_shard_size=f"{shard_kb}KB")
    else:
        save_kv_heavy(folder)
    for junk in JUNK:
        (folder / junk).parent.mkdir(parents=True, exist_ok=True)
        (folder / junk).write_bytes(b"not for a load")
    return folder


def fetch_log(hub: Path) -> list[dict]:
    log = hub / FETCH_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_fetched_repo_holds_only_what_a_load_reads_in_a_real_hub_cache(tmp_path):
    hub, cache = tmp_path / "hub", tmp_path / "cache"
    repo = save_repo(hub, "kvsweep-test/sharded", shard_kb=200)
    shards = sorted(p.name for p in repo.glob("model-*.safetensors"))
    assert len(shards) > 1  # the model really is sharded
    fetched = fetch_on_node("kvsweep-test/sharded", HubSettings(False, None, str(cache)), FolderHub(str(hub)))
    assert fetched.problem is None and fetched.fetched
    snapshot = cached_snapshot("kvsweep-test/sharded", str(cache))
    assert snapshot is not None and snapshot.parent.parent.name == "models--kvsweep-test--sharded"
    got = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    assert got == sorted(["config.json", "generation_config.json", "model.safetensors.index.json", *shards])
    assert fetched.files == len(got) and fetched.bytes == sum((repo / f).stat().st_size for f in got)
    assert fetched.facts is not None and fetched.facts.shape.layers == 16  # kv_heavy's 16 layers, from the files


def test_gated_missing_and_offline_repos_say_why_and_a_cached_one_is_used_offline(tmp_path):
    hub, cache = tmp_path / "hub", tmp_path / "cache"
    save_repo(hub, TINY)
    save_repo(hub, "kvsweep-test/gated")
    (hub / "kvsweep-test" / "gated.gated").write_text(ACCEPTED_TOKEN)
    online = HubSettings(False, USER_TOKEN, str(cache))
    offline = HubSettings(True, None, str(cache))
    source = FolderHub(str(hub))

    gated = fetch_on_node("kvsweep-test/gated", online, source).problem
    assert gated.startswith("kvsweep-test/gated is gated and the token (HF_TOKEN) has no access")
    assert "https://huggingface.co/kvsweep-test/gated" in gated
    missing = fetch_on_node("kvsweep-test/missing", online, source).problem
    assert missing.startswith("kvsweep-test/missing is not on the Hub")
    not_cached = fetch_on_node(TINY, offline, source).problem
    assert not_cached == f"HF_HUB_OFFLINE is set and {TINY} is not in the Hub cache ({cache})"
    assert fetch_log(hub) == []  # offline: the Hub is never asked

    assert fetch_on_node("kvsweep-test/gated", HubSettings(False, ACCEPTED_TOKEN, str(cache)), source).problem is None
    assert fetch_on_node(TINY, online, source).problem is None
    fetches = len(fetch_log(hub))
    cached = fetch_on_node(TINY, offline, source)
    assert cached.problem is None and not cached.fetched and len(fetch_log(hub)) == fetches


def test_a_cell_loads_a_fetched_model_from_the_cache_with_no_hub(tmp_path):
    hub, cache = tmp_path / "hub", tmp_path / "cache"
    save_repo(hub, TINY)
    assert fetch_on_node(TINY, HubSettings(False, None, str(cache)), FolderHub(str(hub))).problem is None
    shutil.rmtree(hub)  # nothing left to fetch from: the cell can only read the cache
    cell = Cell(TINY, "float32", 32, 1, 4, "dynamic", False)
    protocol = MeasureProtocol.exact(warmup=0, repeats=1, seed=0, device="cpu", threads=1).to_dict()

    result = measure_cell(cell.to_dict(), protocol, hub_cache={TINY: str(cache)})
    assert result["status"] == "ok", result["error"]
    assert result["cell"]["model"] == TINY  # the Hub id stays the cell's model
    assert result["metrics"]["kv_cache_bytes"] == KV_HEAVY_BYTES_PER_TOKEN * (32 + 4 - 1)

    elsewhere = measure_cell(cell.to_dict(), protocol, hub_cache={TINY: str(tmp_path / "empty")})
    assert elsewhere["status"] == "error" and "has no snapshot of it on this node" in elsewhere["error"]


# -- whole sweeps (Ray): the order, the skips, the parent run's metric, the token


def sweep_hub(tmp_path: Path, monkeypatch) -> Path:
    """A stand-in Hub: a tiny model, a gated one (not for the user's token), one whose errors quote the token."""
    hub = tmp_path / "hub"
    save_repo(hub, TINY)
    for name in ("gated", "leaky"):
        save_repo(hub, f"kvsweep-test/{name}")
    (hub / "kvsweep-test" / "gated.gated").write_text(ACCEPTED_TOKEN)
    (hub / "kvsweep-test" / "leaky.error").write_text("")
    (hub / "delay_s").write_text("1.0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return hub


def everything_written(tmp_path: Path, uri: str) -> str:
    """Every file under tmp_path (run folder, MLflow's store) and every MLflow artifact, as text."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    texts = [p.read_bytes().decode(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            texts.append(json.dumps({"params": run.data.params, "tags": run.data.tags}))
            folder = client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts" / run.info.run_id))
            texts += [p.read_bytes().decode(errors="replace") for p in Path(folder).rglob("*") if p.is_file()]
    return "\n".join(texts)


@pytest.mark.slow
def test_a_sweep_fetches_before_its_cells_skips_what_it_cannot_fetch_and_never_shows_the_token(
    run_sweep, tmp_path, monkeypatch
):
    from conftest import cell_runs, statuses

    hub = sweep_hub(tmp_path, monkeypatch)
    # Only kvsweep's own reading of the driver's environment sees the Hub online, and its fetches go to the seam:
    # huggingface_hub read HF_HUB_OFFLINE=1 when this process imported it, as Ray's workers did when they started.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_TOKEN", USER_TOKEN)
    models = [TINY, "kvsweep-test/gated", "kvsweep-test/missing", "kvsweep-test/leaky"]
    run = run_sweep(f"grid.models=[{','.join(models)}]", "grid.caches=[dynamic]", f"+testing.hub={hub}")
    assert run.code == 0, run.out + run.err

    assert statuses(run.tracking_uri, "model") == {
        TINY: "ok",  # loaded by Transformers in the cell, from the cache the fetch wrote
        "kvsweep-test/gated": "skipped",
        "kvsweep-test/missing": "skipped",
        "kvsweep-test/leaky": "skipped",
    }
    parents, children = cell_runs(run.tracking_uri)
    by_model = {c.data.params["model"]: c for c in children}
    reasons = {model: child.data.tags.get("kvsweep.error", "") for model, child in by_model.items()}
    assert "is gated and the token (HF_TOKEN) has no access" in reasons["kvsweep-test/gated"]
    assert "is not on the Hub" in reasons["kvsweep-test/missing"]
    assert "ConnectionError" in reasons["kvsweep-test/leaky"] and MASK in reasons["kvsweep-test/leaky"]
    for model in models:
        assert model in run.out  # each model's outcome is printed

    fetches = fetch_log(hub)
    assert [f["repo"] for f in fetches] == [TINY]  # once (one node), only the model it could fetch
    assert sorted(fetches[0]["files"]) == ["config.json", "generation_config.json", "model.safetensors"]
    assert max(f["ended"] for f in fetches) < by_model[TINY].info.start_time / 1000  # done before its cell began

    (parent,) = parents
    assert parent.data.metrics["hub_fetch_s"] >= 1.0  # the stand-in Hub's 1 s delay, outside every cell
    assert not any("hub_fetch_s" in c.data.metrics for c in children)

    assert USER_TOKEN not in run.out + run.err
    assert USER_TOKEN not in everything_written(tmp_path, run.tracking_uri)


@pytest.mark.slow
def test_offline_a_cached_model_runs_without_a_fetch_and_an_uncached_one_is_skipped_saying_so(
    run_sweep, tmp_path, monkeypatch
):
    from conftest import cell_runs, statuses

    hub = sweep_hub(tmp_path, monkeypatch)
    cache = str(tmp_path / "hf" / "hub")  # HF_HOME's Hub cache, filled before the sweep
    assert fetch_on_node(TINY, HubSettings(False, None, cache), FolderHub(str(hub))).problem is None
    before = len(fetch_log(hub))
    run = run_sweep(f"grid.models=[{TINY},kvsweep-test/uncached]", "grid.caches=[dynamic]", f"+testing.hub={hub}")
    assert run.code == 0, run.out + run.err

    assert statuses(run.tracking_uri, "model") == {TINY: "ok", "kvsweep-test/uncached": "skipped"}
    _, children = cell_runs(run.tracking_uri)
    (uncached,) = [c for c in children if c.data.params["model"] == "kvsweep-test/uncached"]
    assert uncached.data.tags["kvsweep.error"].startswith("HF_HUB_OFFLINE is set and kvsweep-test/uncached is not")
    assert len(fetch_log(hub)) == before  # offline: nothing was fetched
