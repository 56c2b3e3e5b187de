"""A cell over several GPUs: the split the planner predicts is the best one, its per-GPU bytes are worked out
by hand for Llama 3.1 70B, and a model placed over devices (CPU devices here, through the same device list a
GPU cell uses) runs its layers where the split put them and generates what the unsplit model does."""

import itertools

import pytest
import torch

from kvsweep.caches import get_strategy
from kvsweep.cli import main
from kvsweep.grid import Cell
from kvsweep.models.build import Split, build_model, build_split_model, decoder_layers, device_map, torch_dtype_of
from kvsweep.models.facts import ModelFacts, read_facts
from kvsweep.models.resolve import classify
from kvsweep.models.sharding import LayerCosts, load, split_layers
from kvsweep.plan.memory_fit import CUDA_CONTEXT_BYTES, estimate_peak, layer_costs
from kvsweep.units import GB


def layers_per_device(placed: dict[str, str], layers_name: str) -> dict[str, int]:
    """How many decoder layers each device runs, read back from a device map."""
    counts: dict[str, int] = {}
    for name, device in placed.items():
        if name.startswith(layers_name + "."):
            counts[device] = counts.get(device, 0) + 1
    return counts


def costs(weights: list[int], first: int = 0, last: int = 0, head_on_first: bool = False, **kw: object) -> LayerCosts:
    n = len(weights)
    fields = dict(
        first=first,
        last=last,
        weights=tuple(weights),
        kv=(0,) * n,
        moved_kv=(0,) * n,
        device_layers=0,
        working=0,
        layer_working=(0,) * n,
        head_working=0,
        head_on_first=head_on_first,
    )
    return LayerCosts(**{**fields, **kw})  # type: ignore[arg-type]


def brute_force(c: LayerCosts, gpus: int) -> int:
    """The smallest largest peak over every way to cut the layers into `gpus` non-empty runs."""
    n = len(c.weights)
    best = None
    for cuts in itertools.combinations(range(1, n), gpus - 1):
        bounds = (0, *cuts, n)
        worst = max(load(c, g, gpus, range(bounds[g], bounds[g + 1])).peak_bytes for g in range(gpus))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


def test_the_split_is_the_best_contiguous_one_and_puts_the_embeddings_and_head_where_they_run():
    even = split_layers(costs([10] * 8), 2)
    assert [(r.layers.start, r.layers.stop) for r in even] == [(0, 4), (4, 8)]
    # heavy embeddings on the first GPU: it takes fewer layers
    heavy = split_layers(costs([10] * 8, first=40), 2)
    assert [len(r.layers) for r in heavy] == [2, 6] and heavy[0].weights_bytes == heavy[1].weights_bytes == 60
    # a tied head runs on the first GPU, with its logits; else on the last
    tied = split_layers(costs([10] * 4, head_working=25, head_on_first=True), 2)
    assert [r.holds_head for r in tied] == [True, False] and tied[0].working_bytes == 25
    # random shapes, cache, moved layers and transient copies: the split's largest peak is the brute force's
    rng = torch.Generator().manual_seed(3)
    for trial in range(30):
        n, gpus = int(torch.randint(2, 9, (1,), generator=rng)), int(torch.randint(1, 4, (1,), generator=rng))
        gpus = min(gpus, n)

        def draw(hi: int, size: int) -> tuple[int, ...]:
            return tuple(int(v) for v in torch.randint(0, hi, (size,), generator=rng))

        c = costs(
            list(draw(100, n)),
            first=draw(200, 1)[0],
            last=draw(200, 1)[0],
            kv=draw(30, n),
            moved_kv=draw(50, n),
            device_layers=trial % 3,
            working=7,
            layer_working=draw(20, n),
            head_working=11,
            head_on_first=bool(trial % 2),
        )
        found = split_layers(c, gpus)
        assert max(r.peak_bytes for r in found) == brute_force(c, gpus), (trial, c)
        assert found[0].layers.start == 0 and found[-1].layers.stop == n
        assert all(a.layers.stop == b.layers.start for a, b in itertools.pairwise(found))
    with pytest.raises(ValueError, match="cannot place 2 decoder layers on 3 GPUs"):
        split_layers(costs([1, 1]), 3)


@pytest.mark.parametrize("cache", ["dynamic", "static", "quantized-quanto-int4", "offloaded"])
def test_one_gpu_split_predicts_what_the_single_gpu_estimate_does(cache):
    """Two ways to the same peak: the whole-model estimate, and the layer-by-layer split on one GPU."""
    facts = read_facts(classify("qwen3-8b"))
    cell = Cell("qwen3-8b", "bfloat16", 4096, 2, 64, cache, False)
    whole = estimate_peak(cell, get_strategy(cache), facts.shape, facts.parameters)
    assert facts.parameters is not None and facts.layout is not None
    split = estimate_peak(cell, get_strategy(cache), facts.shape, facts.parameters, 2, facts.layout)
    one = split_layers_on_one(cell, cache, facts)
    assert one == whole.peak_bytes
    # over two GPUs: all of the weights and cache are somewhere (an offloaded cache's layers in use on each GPU:
    # at least what one GPU holds)
    assert sum(g.weights_bytes for g in split.per_gpu) == whole.weights_bytes
    held = sum(g.kv_bytes for g in split.per_gpu)
    assert held >= whole.kv_device_bytes if cache == "offloaded" else held == whole.kv_device_bytes


def split_layers_on_one(cell: Cell, cache: str, facts: ModelFacts) -> int:
    assert facts.layout is not None
    (only,) = split_layers(layer_costs(cell, get_strategy(cache), facts.shape, facts.layout), 1)
    return only.peak_bytes


# Llama 3.1 70B's published shapes, by hand: hidden 8192, MLP 28672, 80 layers, 64 query heads and 8 KV
# heads of 128, vocabulary 128256, head not tied. bf16: 2 bytes.
HIDDEN, MLP, LAYERS, VOCAB, KV_WIDTH = 8192, 28672, 80, 128256, 8 * 128
LAYER_PARAMS = HIDDEN * (HIDDEN + 2 * KV_WIDTH) + HIDDEN * HIDDEN + 3 * HIDDEN * MLP + 2 * HIDDEN  # + 2 RMSNorms
EMBED_PARAMS = VOCAB * HIDDEN
CONTEXT, NEW = 8192, 128
CACHED = CONTEXT + NEW - 1  # the last token's K/V is never computed
KV_PER_LAYER = 2 * KV_WIDTH * CACHED * 2  # K and V, batch 1, bf16
ACTIVATIONS = CONTEXT * (4 * HIDDEN + 3 * MLP) * 2  # prefill rows x the planner's per-row allowance
LOGITS = VOCAB * 4 * 2  # the last position's logits in fp32, and their softmax
GPU0 = (EMBED_PARAMS + 40 * LAYER_PARAMS) * 2 + 40 * KV_PER_LAYER + ACTIVATIONS + 2 * KV_PER_LAYER
GPU1 = (40 * LAYER_PARAMS + HIDDEN + EMBED_PARAMS) * 2 + 40 * KV_PER_LAYER + ACTIVATIONS + 2 * KV_PER_LAYER + LOGITS


def test_llama_70b_is_planned_over_two_80gb_gpus_and_not_one(capsys):
    assert read_facts(classify("llama-3.1-70b")).parameters == 80 * LAYER_PARAMS + 2 * EMBED_PARAMS + HIDDEN
    grid = [
        "grid.models=[llama-3.1-70b]",
        "grid.dtypes=[bfloat16]",
        f"grid.context_lengths=[{CONTEXT}]",
        "grid.batch_sizes=[1]",
        f"grid.max_new_tokens=[{NEW}]",
        "grid.caches=[dynamic]",
        "device=cuda",
        "planner.device_memory_gb=80",
        "dry_run=true",
    ]
    assert main([*grid, "ray.gpus_per_cell=1"]) == 0
    one = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("dynamic ctx8192"))
    needs = (80 * LAYER_PARAMS + 2 * EMBED_PARAMS + HIDDEN) * 2 + LAYERS * KV_PER_LAYER + ACTIVATIONS
    needs += LOGITS + 2 * KV_PER_LAYER
    assert f"skip: predicted oom: needs {needs / GB:.1f} GB" in one, one
    assert main([*grid, "ray.gpus_per_cell=2"]) == 0
    two = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("dynamic ctx8192"))
    assert GPU0 + CUDA_CONTEXT_BYTES <= 80 * GB and GPU1 + CUDA_CONTEXT_BYTES <= 80 * GB  # it does fit, by hand
    assert "skip" not in two and "2 GPUs, layers 0-39 | 40-79" in two, two
    assert f"peak per GPU {GPU0 / 2**20:.0f} + {GPU1 / 2**20:.0f} MiB" in two, two
    assert f"peak {max(GPU0, GPU1) / 2**20:10.1f} MiB" in two


def test_a_compiled_cell_over_two_gpus_is_planned_skipped_with_the_reason_and_one_gpu_still_compiles(capsys):
    """Inductor refuses CUDA graphs for a graph spanning devices; the cell would fail its CUDA-graph check after
    compiling and measuring, so the plan skips it before it costs anything."""
    grid = [
        "grid.models=[llama-3.1-70b]",
        "grid.dtypes=[bfloat16]",
        "grid.context_lengths=[1024]",
        "grid.batch_sizes=[1]",
        "grid.max_new_tokens=[16]",
        "grid.caches=[static]",
        "grid.compile=[false,true]",
        "device=cuda",
        "planner.device_memory_gb=80",
        "dry_run=true",
    ]
    assert main([*grid, "ray.gpus_per_cell=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    compiled = next(line for line in lines if line.startswith("static+compile ctx1024"))
    plain = next(line for line in lines if line.startswith("static ctx1024"))
    assert "skip: compile=true over 2 GPUs" in compiled and "CUDA graph" in compiled, compiled
    assert "skip" not in plain and "2 GPUs" in plain, plain
    assert main([*grid, "grid.models=[llama-3.1-8b]", "ray.gpus_per_cell=1"]) == 0
    one = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("static+compile ctx1024"))
    assert "compile=true over" not in one, one


@pytest.fixture
def tied_checkpoint(tmp_path):
    """A saved tiny Llama whose head is tied to its embeddings: loaded through `from_pretrained(device_map=...)`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from kvsweep.models.presets import PRESETS

    config = AutoConfig.for_model("llama", **{**PRESETS["tiny-llama"].config, "tie_word_embeddings": True})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "tied")
    return str(tmp_path / "tied")


@pytest.mark.parametrize("which", ["preset", "checkpoint"])
def test_a_model_placed_over_devices_runs_each_layer_where_the_split_put_it(which, request):
    """The placement path a 2-GPU cell takes, with the device list a GPU cell would pass replaced by CPU
    devices: the device map follows the split (the embeddings with the first GPU's layers, the head with
    the last's, or with the embeddings when tied), every layer is dispatched with a hook that moves its
    inputs to its device, and greedy tokens equal the unsplit model's."""
    reference = "tiny-llama" if which == "preset" else request.getfixturevalue("tied_checkpoint")
    ref, dtype = classify(reference), torch_dtype_of("float32")
    facts = read_facts(ref)
    assert facts.parameters is not None
    cell = Cell(reference, "float32", 16, 1, 4, "dynamic", False)
    estimate = estimate_peak(cell, get_strategy("dynamic"), facts.shape, facts.parameters, 2, facts.layout)
    first, second = estimate.per_gpu
    assert (first.holds_head, second.holds_head) == ((True, False) if which == "checkpoint" else (False, True))

    model, placed = build_split_model(ref, dtype, 0, Split(("cpu", "cpu"), estimate.per_gpu))
    layers = decoder_layers(model, facts.shape.layers)
    named = device_map(model, layers, estimate.per_gpu, ("gpu0", "gpu1"))  # the same map, devices told apart
    assert layers_per_device(named, layers) == {"gpu0": len(first.layers), "gpu1": len(second.layers)}
    assert all(named[f"{layers}.{i}"] == "gpu0" for i in first.layers)
    assert named["model.embed_tokens"] == "gpu0" and named["model.norm"] == "gpu1"
    assert named["lm_head"] == ("gpu0" if which == "checkpoint" else "gpu1")
    assert set(placed) == set(named) and set(placed.values()) == {"cpu"}
    assert all(hasattr(model.get_submodule(f"{layers}.{i}"), "_hf_hook") for i in range(facts.shape.layers))

    plain = build_model(ref, "float32", "cpu", 0)
    ids = torch.randint(0, facts.shape.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, plain.generate(ids, max_new_tokens=4, do_sample=False))


def test_a_sweep_cell_split_over_two_devices_records_its_placement_and_measures_as_one(run_sweep, tmp_path):
    """Through `python -m kvsweep`, with the device list seam standing in for a cell's two GPUs: the cell
    runs ok, records each device's layers (tag and samples.json), and holds the same KV bytes as unsplit."""
    from conftest import cell_runs
    from kvsweep.tracking.journal import Journal

    split = run_sweep("grid.caches=[dynamic,static]", "+testing.split_devices=2")
    assert split.code == 0, split.out + split.err
    results = {r.cell.cache: r for r in Journal(split.run_dir).read().latest_results()}
    layers = read_facts(classify("tiny-llama")).shape.layers
    for result in results.values():
        assert result.status == "ok", result.error
        first, last = result.samples["placement"]["layers"]
        assert first[0] == 0 and first[1] + 1 == last[0] and last[1] == layers - 1, result.samples["placement"]
        assert result.tags["kvsweep.placement"] == f"{first[0]}-{first[1]} | {last[0]}-{last[1]}"
    _, children = cell_runs(split.tracking_uri)
    assert {c.data.tags["kvsweep.placement"] for c in children} == {results["dynamic"].tags["kvsweep.placement"]}
    whole = run_sweep("grid.caches=[dynamic,static]", "rerun=true")  # a seam is not part of a cell's id
    unsplit = {r.cell.cache: r for r in Journal(whole.run_dir).read().latest_results()}
    for cache, result in results.items():  # the same cache, wherever its layers are
        assert result.metrics["kv_cache_bytes"] == unsplit[cache].metrics["kv_cache_bytes"]
        assert "kvsweep.placement" not in unsplit[cache].tags


def test_a_capacity_search_over_two_gpus_predicts_its_boundary_from_the_fullest_gpu():
    """70B in bf16 at 8k context on 80 GB cards: one GPU cannot hold batch 1, two hold a batch whose predicted
    fullest GPU fits and one more row does not."""
    from kvsweep.capacity.frontier import BATCH, FrontierKey
    from kvsweep.plan.cell_plan import predicted_boundary

    facts = read_facts(classify("llama-3.1-70b"))
    key = FrontierKey(BATCH, "llama-3.1-70b", "bfloat16", "dynamic", False, NEW, "random", CONTEXT)
    budget = 80 * GB - CUDA_CONTEXT_BYTES
    assert predicted_boundary(key, facts, budget, 64, 1) == 0
    batch = predicted_boundary(key, facts, budget, 64, 1, gpus=2)
    assert batch is not None and batch > 0

    def fullest(rows: int) -> int:
        cell = key.cell(rows)
        return estimate_peak(cell, get_strategy("dynamic"), facts.shape, facts.parameters, 2, facts.layout).peak_bytes

    assert fullest(batch) <= budget < fullest(batch + 1)
